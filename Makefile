# The two commands of the README: `make demo` and `make test`. Everything else supports them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The Python SDK 1.x, for the 2025-era test servers (tests/era2025/). Defined before the rules that
# name it: make expands a rule's prerequisites when it reads the rule.
MCP1_VENV  := .venv-mcp1
MCP1_STAMP := $(MCP1_VENV)/.installed

.PHONY: demo test test-compiled test-pure compile cc lint typecheck check schema clean redis-server chromium docker-compose

PORT   ?= 8080

demo: $(STAMP) compile
	$(BIN)/taskgate demo --port $(PORT)

# The suite runs on both builds of one source (docs/performance.md, "Two builds"): compiled with
# mypyc when this machine can compile, then pure. TASKGATE_PURE=1 make ... builds and runs pure.
# Each run is spread over PYTEST_WORKERS processes, a test file to a worker (the suite waits on
# real servers more than it computes: 3 workers halve a run on 2 cores).
PYTEST_WORKERS ?= 3
PYTEST := $(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile

test: $(STAMP) $(MCP1_STAMP) redis-server chromium docker-compose lint typecheck compile
	$(PYTEST)
	TASKGATE_PURE=1 $(PYTEST)

test-compiled: $(STAMP) $(MCP1_STAMP) compile
	$(PYTEST)

test-pure: $(STAMP) $(MCP1_STAMP)
	TASKGATE_PURE=1 $(PYTEST)

# The hot path compiled in place with mypyc (scripts/compile.py: nothing to do when unchanged;
# the pure build, and why, when this machine cannot compile).
compile: $(STAMP) cc
	$(BIN)/python scripts/compile.py

# mypyc needs a C compiler and Python's headers: Debian's gcc and python3-dev when missing
# (not when TASKGATE_PURE asks for the pure build; a Python not from Debian brings its own
# headers or builds pure).
cc: $(STAMP)
	@[ -n "$$TASKGATE_PURE" ] || { command -v cc >/dev/null 2>&1 && $(BIN)/python -c \
	  "import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"; } || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc python3-dev libc6-dev; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc python3-dev libc6-dev; fi; }

# The layers (pyproject.toml, [tool.importlinter]) and the sizes of modules and functions
# (scripts/check_sizes.py) are kept by tools, as the style is (docs/architecture.md, "Layout").
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python scripts/check_sizes.py

typecheck: $(STAMP)
	$(BIN)/mypy

# Regenerates config/schema.json from the pydantic models; a test fails when it is stale.
schema: $(STAMP)
	$(BIN)/taskgate schema > config/schema.json

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || { \
	  apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The 2025-era backends of the bridge tests (tests/era2025) run on the Python SDK 1.x, which
# cannot share a venv with taskgate's SDK 2.x: a venv of their own, pinned in requirements.txt.
$(MCP1_STAMP): tests/era2025/requirements.txt
	test -x $(MCP1_VENV)/bin/python || $(PYTHON) -m venv $(MCP1_VENV) || { \
	  apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(MCP1_VENV); }
	$(MCP1_VENV)/bin/python -m pip install --quiet -r tests/era2025/requirements.txt
	touch $(MCP1_STAMP)

# The store tests start their own redis-server; install Debian's package when it is missing.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq redis-server; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq redis-server; fi; }

# The status page tests load the page in headless Chromium; install Debian's package when missing.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; fi; }

# tests/deploy validates deploy/compose.yaml with `docker-compose config` (Compose v1, Debian's
# package: it needs no Docker daemon); install it when missing.
docker-compose:
	@command -v docker-compose >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose; fi; }

clean:
	rm -rf $(VENV) $(MCP1_VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis build
	find gateway -name '*.so' -delete; rm -f ./*__mypyc*.so

# Coverage-guided fuzzing of the HTTP/1.1 framing, server then client, FUZZ_SECONDS each; not part
# of `make test` (fuzz/README.md). New corpus entries go to fuzz/generated/, crashes to
# fuzz/artifacts/; FUZZ_FLAGS passes libFuzzer options, FUZZ_SKIP names checks not enforced.
.PHONY: fuzz
FUZZ_SECONDS ?= 300
FUZZ_MAX_LEN ?= 4096
FUZZ_FLAGS ?=
fuzz: $(STAMP)
	$(BIN)/python -c 'import atheris' 2>/dev/null || $(BIN)/python -m pip install --quiet atheris
	rc=0; for side in server client; do \
	  mkdir -p fuzz/generated/$$side fuzz/artifacts/$$side; \
	  PATH="$(abspath $(BIN)):$$PATH" fuzz/$${side}_framing.py -max_total_time=$(FUZZ_SECONDS) \
	    -max_len=$(FUZZ_MAX_LEN) -timeout=60 -artifact_prefix=fuzz/artifacts/$$side/ \
	    $(FUZZ_FLAGS) fuzz/generated/$$side fuzz/corpus/$$side || rc=1; \
	done; exit $$rc
