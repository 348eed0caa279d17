"""Two checkouts of taskgate, A and B, measured in turns on one setup: CPU per request.

    python -m bench.ab --a PATH [--b PATH] [--method tasks/get] [--rounds 4] [--seconds 5] [--pure]

On a machine whose speed drifts by more than a change gains (docs/performance.md), only runs
close in time compare. On loopback, once: the instant backend and redis-server. Per round, A
then B: that checkout's `taskgate run` started from its own directory with bench.run's settings
(ES256 JWT, the Redis store, no request log; its compiled files when that checkout has them:
`python scripts/compile.py` there first), a 1-second warm-up, wrk for --seconds at 16
connections, and its CPU per request from /proc. It prints each pair and the median of B/A.
Everything it starts is stopped by pid, also on a failure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench import load, procs
from bench.run import record_task, requests_for, taskgate_config

CONNECTIONS = 16
WARMUP_S = 1.0


def measure(
    root: Path, work: Path, ports: dict[str, int], method: str, seconds: int, build: str
) -> float:
    """One run of the checkout at `root`: its taskgate's own CPU µs per request."""
    backend = f"http://127.0.0.1:{ports['backend']}/mcp"
    settings, token = taskgate_config(work, ports["taskgate"], ports["redis"], backend)
    config = work / "taskgate.yaml"
    config.write_text(json.dumps(settings, indent=2) + "\n")  # JSON is YAML
    argv = [sys.executable, "-m", "gateway", "run", "--config", str(config)]
    argv += ["--log-level", "warning"]
    with procs.started(argv, ports["taskgate"], procs.build_env(build), cwd=root) as proc:
        url = f"http://127.0.0.1:{ports['taskgate']}/mcp"
        request = requests_for(record_task(url, token), token)[method]
        load.check(url, request, f"{root}: {method}")
        compiled = procs.compiled_files_mapped(load.tree(proc.pid), root)
        found = load.drive(str(root), url, request, {"taskgate": proc.pid}, seconds=seconds,
                           connections=CONNECTIONS, threads=1, warmup_s=WARMUP_S)  # fmt: skip
    cpu: float = found["cpu_us_per_request"]["taskgate"]
    shown = f"{len(compiled)} compiled file(s) mapped" if compiled else "pure"
    print(f"  {root}: {cpu:.1f} us per request, {found['requests_per_s']:.0f} req/s ({shown})")
    return cpu


def main(a: Path, b: Path, method: str, rounds: int, seconds: int, build: str) -> None:
    pairs: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="taskgate-bench-ab-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        ports = dict(zip(("backend", "redis", "taskgate"), procs.free_ports(3), strict=True))
        (work / "redis").mkdir()
        stack.enter_context(procs.instant_backend(ports["backend"]))
        stack.enter_context(procs.redis(ports["redis"], work / "redis"))
        if build == "compiled":
            for root in (a, b):
                procs.check_compiled_current(root)
        print(f"bench.ab: {method}, {CONNECTIONS} connections, {seconds} s per run, A then B, "
              f"the {build} build")  # fmt: skip
        for n in range(rounds):
            print(f"round {n + 1} of {rounds}")
            pairs.append((measure(a, work, ports, method, seconds, build),
                          measure(b, work, ports, method, seconds, build)))  # fmt: skip
    print("pairs (A, B, B/A): " + "; ".join(f"{x:.1f}, {y:.1f}, {y / x:.3f}" for x, y in pairs))
    ratio = statistics.median(y / x for x, y in pairs)
    lower = sum(y < x for x, y in pairs)
    print(f"median B/A {ratio:.3f}; B lower in {lower} of {len(pairs)} pairs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="checkout A (the baseline)")
    parser.add_argument("--b", type=Path, default=procs.ROOT, help="checkout B (default: this)")
    parser.add_argument("--method", choices=["tasks/get", "tools/call"], default="tasks/get")
    parser.add_argument("--rounds", type=int, default=4, help="pairs of runs (1..20)")
    parser.add_argument("--seconds", type=int, default=5, help="each run (1..60)")
    parser.add_argument("--pure", action="store_true", help="both with TASKGATE_PURE=1")
    args = parser.parse_args()
    if not (1 <= args.rounds <= 20 and 1 <= args.seconds <= 60):
        parser.error("--rounds 1..20, --seconds 1..60 (the run is bounded)")
    build = "pure" if args.pure else "compiled"
    main(args.a.resolve(), args.b.resolve(), args.method, args.rounds, args.seconds, build)
