"""Tasks taskgate runs itself against routed tasks, in one run, on one Redis store.

    python -m bench.made [--seconds 5] [--connections 16] [--creations 2000] [--json out.json]

Starts on loopback: two instant backends (bench/instant_backend.py), one declaring the Tasks
extension (its `make_task` creates a routed task) and one without it (its `echo` taskgate runs
as a task of its own: the route's `task.mode: always`); a redis-server and a replica of it; and
taskgate twice on that store, once with `store.durability: none` and once with
`wait_replicas: 1`. Then, measured with wrk at `--connections` (bench/load.py: every answer
checked, each process's CPU read from /proc over the run):

1. `tasks/get` of a routed task (taskgate reads its route, from its cache, and forwards) and of
   a task taskgate made (read from the store on every call: it changes), alternated twice;
2. task creation through taskgate, for each durability: `tools/call` of `make_task` (a route
   recorded) and of `echo` run as a task (a record created, the call run, its end written);
3. in process, sequentially: MadeTaskStore.create against pydocket's `Docket.add` on the
   same Redis (docs/decisions.md, 44: what a job library's enqueue would cost instead).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from bench import load, procs
from gateway.store.base import now_ms
from gateway.store.made import WORKING, MadeTask
from gateway.store.redis_routes import RedisRouteStore

LIMITS = {"max_running": 100_000, "max_running_per_principal": 100_000,
          "max_per_principal": 1_000_000, "max_total": 10_000_000}  # fmt: skip


def write_config(path: Path, port: int, routed: str, plain: str, redis: str, wait: bool) -> None:
    store: dict[str, Any] = {"url": redis}
    if wait:
        store |= {"durability": "wait_replicas", "wait_replicas": 1}
    config = {
        "listen": {"host": "127.0.0.1", "port": port, "max_in_flight": 4096},
        "store": store,
        "tasks": {"made": LIMITS},
        "backends": {"routed": {"replicas": [routed]}, "plain": {"replicas": [plain]}},
        "routes": [
            {"tools": ["make_task"], "backend": "routed"},
            {"tools": ["echo"], "backend": "plain", "task": {"mode": "always", "ttl_s": 120}},
        ],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))


@contextmanager
def started(work: Path) -> Iterator[dict[str, Any]]:
    """The backends, Redis and its replica, and both taskgates; their URLs and pids."""
    ports = {
        name: procs.free_port() for name in ("routed", "plain", "redis", "replica", "g0", "g1")
    }
    url = {name: f"http://127.0.0.1:{ports[name]}/mcp" for name in ("routed", "plain")}
    redis_url = f"redis://127.0.0.1:{ports['redis']}/0"
    with ExitStack() as stack:
        stack.enter_context(procs.instant_backend(ports["routed"]))
        stack.enter_context(procs.instant_backend(ports["plain"], tasks=False))
        (work / "master").mkdir()
        (work / "replica").mkdir()
        stack.enter_context(procs.redis(ports["redis"], work / "master"))
        replica_argv = ["redis-server", "--port", str(ports["replica"]), "--bind", "127.0.0.1"]
        replica_argv += ["--dir", str(work / "replica"), "--save", "", "--appendonly", "no"]
        replica_argv += ["--replicaof", "127.0.0.1", str(ports["redis"])]
        stack.enter_context(procs.started(replica_argv, ports["replica"]))
        pids = {}
        for name, wait in (("g0", False), ("g1", True)):
            config = work / f"{name}.yaml"
            write_config(config, ports[name], url["routed"], url["plain"], redis_url, wait)
            pids[name] = stack.enter_context(procs.taskgate(config, ports[name])).pid
        yield {
            "gateways": {n: f"http://127.0.0.1:{ports[n]}/mcp" for n in ("g0", "g1")},
            "pids": pids,
            "redis": redis_url,
        }


def _created(url: str, tool: str) -> str:
    request = load.Request("tools/call", {"name": tool, "arguments": {}}, name=tool)
    answer, _ = load.check(url, request, f"taskgate {tool}")
    task_id: str = answer["result"]["taskId"]
    return task_id


def _shown(found: dict[str, Any], pid_name: str) -> dict[str, Any]:
    return {
        "requests_per_s": found["requests_per_s"],
        "p50_ms": found["p50_ms"],
        "p99_ms": found["p99_ms"],
        "taskgate_cpu_us_per_request": found["cpu_us_per_request"][pid_name],
        "cpu_share_other_processes": found["cpu_share"]["other_processes"],
    }


def measure(run: dict[str, Any], seconds: int, connections: int) -> dict[str, Any]:
    g0 = run["gateways"]["g0"]
    pids = {"taskgate": run["pids"]["g0"]}
    routed_id, made_id = _created(g0, "make_task"), _created(g0, "echo")
    gets = {
        "routed": load.Request(
            "tasks/get", {"taskId": routed_id}, name=routed_id, expect=routed_id
        ),
        "made": load.Request("tasks/get", {"taskId": made_id}, name=made_id, expect='"completed"'),
    }
    found: dict[str, Any] = {"tasks_get": {"routed": [], "made": []}, "create": {}}
    threads = min(connections, 2)
    for _ in range(2):  # alternated, so that drift on a shared machine hits both alike
        for kind, request in gets.items():
            done = load.drive(f"tasks/get {kind}", g0, request, pids, seconds=seconds,
                              connections=connections, threads=threads)  # fmt: skip
            found["tasks_get"][kind].append(_shown(done, "taskgate"))
    for name, durability in (("g0", "none"), ("g1", "wait_replicas=1")):
        url, pid = run["gateways"][name], {"taskgate": run["pids"][name]}
        for tool, expect in (("make_task", '"taskId"'), ("echo", '"taskId"')):
            request = load.Request("tools/call", {"name": tool, "arguments": {}}, name=tool,
                                   expect=expect)  # fmt: skip
            done = load.drive(f"create {tool} {durability}", url, request, pid, seconds=seconds,
                              connections=connections, threads=threads)  # fmt: skip
            kind = "routed (make_task)" if tool == "make_task" else "made (echo as a task)"
            found["create"][f"{kind}, {durability}"] = _shown(done, "taskgate")
    return found


async def enqueue_costs(redis_url: str, count: int) -> dict[str, Any]:
    """MadeTaskStore.create against pydocket's Docket.add, one at a time, on one Redis."""
    from docket import Docket

    store = RedisRouteStore(redis_url, timeout_s=5)
    made = store.made()
    ours: list[float] = []
    theirs: list[float] = []

    async def noop() -> None:
        return None

    try:
        async with Docket(name=f"bench-{time.time_ns()}", url=redis_url,
                          execution_ttl=timedelta(seconds=60)) as docket:  # fmt: skip
            docket.register(noop)
            for n in range(count + 50):
                now = now_ms()
                record = MadeTask(
                    task_id=f"taskgate.bench-{time.time_ns()}-{n}", tenant="t", principal="p",
                    backend="b", tool="echo", status=WORKING, created_at_ms=now,
                    updated_at_ms=now, ttl_ms=60_000, poll_interval_ms=1000, holder="bench",
                    lease_until_ms=now + 15_000,
                )  # fmt: skip
                started = time.perf_counter()
                await made.create(record, per_principal=0, total=0)
                middle = time.perf_counter()
                await docket.add(noop)()
                ended = time.perf_counter()
                if n >= 50:  # the first are the warm-up
                    ours.append((middle - started) * 1000)
                    theirs.append((ended - middle) * 1000)
    finally:
        await store.close()
    return {"taskgate_create": _summary(ours), "pydocket_add": _summary(theirs)}


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(ordered[len(ordered) // 2], 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
        "mean_ms": round(statistics.fmean(samples), 3),
        "n": len(samples),
    }


def main(seconds: int, connections: int, creations: int, out: Path | None) -> None:
    results: dict[str, Any] = {
        "method": __doc__.strip().splitlines()[0],
        "machine": load.machine(redis=["redis-server", "--version"]),
        "seconds": seconds,
        "connections": connections,
    }
    with (
        tempfile.TemporaryDirectory(prefix="taskgate-bench-made-") as tmp,
        started(Path(tmp)) as run,
    ):
        results.update(measure(run, seconds, connections))
        results["enqueue_in_process"] = asyncio.run(enqueue_costs(run["redis"], creations))
    gets = results["tasks_get"]
    for kind in ("routed", "made"):
        rates = [r["requests_per_s"] for r in gets[kind]]
        cpu = [r["taskgate_cpu_us_per_request"] for r in gets[kind]]
        print(f"tasks/get {kind:>6}: {statistics.fmean(rates):8.0f} req/s, taskgate "
              f"{statistics.fmean(cpu):6.1f} us CPU/request (runs: {rates})")  # fmt: skip
    for kind, found in results["create"].items():
        print(f"create {kind}: {found['requests_per_s']:.0f}/s, p99 {found['p99_ms']} ms, "
              f"taskgate {found['taskgate_cpu_us_per_request']} us CPU/request")  # fmt: skip
    for kind, found in results["enqueue_in_process"].items():
        print(f"in process {kind}: p50 {found['p50_ms']} ms, p99 {found['p99_ms']} ms")
    if out is not None:
        out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--creations", type=int, default=2000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not 1 <= args.seconds <= 60:
        sys.exit("--seconds must be 1..60 (the run is bounded)")
    main(args.seconds, args.connections, args.creations, args.json)
