"""Compile taskgate's hot path with mypyc, in place: `make compile` (issue 17).

    python scripts/compile.py
    python scripts/compile.py --check    # exit 1 when the compiled files are not of these sources

The modules are the `include` list of pyproject.toml's mypyc hook, the one list the release
wheel compiles too. Each extension lands beside its .py file, where Python's import prefers it;
`TASKGATE_PURE=1` at run time ignores them (gateway/_pure.py). Here, `TASKGATE_PURE=1` removes
them and compiles nothing: the pure build.

Without a C compiler or Python's headers nothing is compiled and the pure build stays, and this
says why (exit 0); a compiler that fails is an error (exit 1), not a silent fallback. An
unchanged tree is not compiled again: build/mypyc.stamp holds a digest of the sources, the list
and mypy's version. `--check` compiles nothing: it says whether the extensions present were
built from the sources as they are (the benchmarks ask, so as never to measure a stale build).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = ROOT / "build" / "mypyc.stamp"
LOG = ROOT / "build" / "mypyc.log"


_SETUP = """# Written by scripts/compile.py; run from the repository's root.
from setuptools import setup
from mypyc.build import mypycify

setup(
    name="taskgate-hot-path",
    packages=[],
    py_modules=[],
    ext_modules=mypycify(["--config-file", "mypyc.ini", *{sources!r}], opt_level="3"),
)
"""


def modules() -> list[str]:
    """The sources the mypyc hook of pyproject.toml compiles."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    hook = config["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["mypyc"]
    return list(hook["include"])


def extensions() -> list[Path]:
    """Compiled files in the tree: each module's, and mypyc's shared library at the root."""
    found = [
        path
        for suffix in EXTENSION_SUFFIXES
        for path in [*(ROOT / "gateway").rglob(f"*{suffix}"), *ROOT.glob(f"*__mypyc{suffix}")]
    ]
    return sorted(set(found))


def remove_extensions() -> int:
    found = extensions()
    for path in found:
        path.unlink()
    STAMP.unlink(missing_ok=True)
    return len(found)


def missing_toolchain() -> str | None:
    """Why this machine cannot compile, or None."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler!r} is not on PATH; Debian: apt-get install gcc)"
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").exists():
        return f"no Python headers ({include}/Python.h; Debian: apt-get install python3-dev)"
    return None


def digest(sources: list[str]) -> str:
    import mypy.version

    hasher = hashlib.blake2b(digest_size=16)
    hasher.update(mypy.version.__version__.encode())
    hasher.update((ROOT / "mypyc.ini").read_bytes())
    hasher.update(sys.version.encode())
    for source in sources:
        hasher.update(source.encode() + b"\0")
        hasher.update((ROOT / source).read_bytes())
    return hasher.hexdigest()


def up_to_date(sources: list[str]) -> bool:
    """Whether the extensions present were compiled from `sources` as they are now."""
    return (
        STAMP.exists() and STAMP.read_text() == digest(sources) and len(extensions()) > len(sources)
    )


def check() -> int:
    sources = modules()
    if up_to_date(sources):
        print(f"compile: {len(sources)} modules compiled with mypyc, up to date")
        return 0
    found = len(extensions())
    print(
        f"compile: the compiled build is not of these sources ({found} compiled files; "
        "run `make compile`)",
        file=sys.stderr,
    )
    return 1


def main() -> int:
    if sys.argv[1:] == ["--check"]:
        return check()
    if sys.argv[1:]:
        print(f"usage: {sys.argv[0]} [--check]", file=sys.stderr)
        return 2
    if os.environ.get("TASKGATE_PURE", "") not in ("", "0"):
        removed = remove_extensions()
        print(f"compile: TASKGATE_PURE is set: the pure build ({removed} compiled files removed)")
        return 0
    why = missing_toolchain()
    if why is not None:
        removed = remove_extensions()
        print(f"compile: {why}; taskgate runs the pure build ({removed} compiled files removed)")
        return 0
    sources = modules()
    wanted = digest(sources)
    if up_to_date(sources):
        print(f"compile: {len(sources)} modules compiled with mypyc, up to date")
        return 0
    remove_extensions()
    STAMP.parent.mkdir(exist_ok=True)
    # mypyc's own command line runs setuptools on a setup.py that discovers packages, which
    # this tree (several top-level folders) refuses: the same build, with nothing to discover.
    setup = STAMP.parent / "mypyc_setup.py"
    setup.write_text(_SETUP.format(sources=sources))
    command = [sys.executable, str(setup), "build_ext", "--inplace"]
    started = time.monotonic()
    print(f"compile: {len(sources)} modules with mypyc (a few minutes; log in {LOG})", flush=True)
    with LOG.open("w") as log:
        log.write("$ " + shlex.join(command) + "\n")
        log.flush()
        done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = LOG.read_text(errors="replace").splitlines()[-30:]
        print("\n".join(tail), file=sys.stderr)
        print(f"compile: mypyc failed (exit {done.returncode}); see {LOG}", file=sys.stderr)
        remove_extensions()
        return 1
    STAMP.write_text(wanted)
    took = time.monotonic() - started
    print(f"compile: {len(sources)} modules compiled with mypyc in {took:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
