"""How taskgate's cost grows with open event streams: memory, idle CPU, and throughput beside them.

    python -m bench.streams [--streams 0,100,1000] [--seconds 4] [--json out.json]

Starts on loopback the instant backend, Redis and `taskgate run` (ES256 JWT, the Redis store,
limits raised above the largest stream count), as bench/run.py does. For each count N it opens
N streams through taskgate (tools/call `hold`: the backend sends one event, then holds the
stream open and idle), waits until each has relayed its first event, and measures with them
open: taskgate's resident memory (VmRSS), its CPU over 2 s of idleness, and `tasks/get` of a
recorded task under wrk at 16 connections (req/s, p50, p99, taskgate's CPU per request). Then it
closes the streams before the next count. Everything it started is stopped by pid at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from bench import load, procs, run

OPEN_TIMEOUT_S = 60.0
IDLE_S = 2.0
WRK_CONNECTIONS = 16


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise SystemExit(f"no VmRSS for pid {pid}")


@contextlib.contextmanager
def started(work: Path, limit: int) -> Iterator[tuple[str, int, str]]:
    """The backend, Redis and taskgate; yields taskgate's URL, its pid and a token."""
    names = ("backend", "redis", "taskgate")
    ports = dict(zip(names, procs.free_ports(len(names)), strict=True))
    (work / "redis").mkdir()
    backend_url = f"http://127.0.0.1:{ports['backend']}/mcp"
    with contextlib.ExitStack() as stack:
        stack.enter_context(procs.instant_backend(ports["backend"]))
        stack.enter_context(procs.redis(ports["redis"], work / "redis"))
        settings, token = run.taskgate_config(work, ports["taskgate"], ports["redis"], backend_url)
        settings["listen"]["max_in_flight"] = limit
        # One tenant holds every stream here: the tenant share (decision 35) would stop it at half.
        settings["listen"]["tenant_share"] = 1.0
        backend = settings["backends"]["instant"]
        backend.update({"max_in_flight": limit, "timeout_s": 3600})
        config = work / "taskgate.yaml"
        config.write_text(json.dumps(settings, indent=2) + "\n")
        taskgate = stack.enter_context(procs.taskgate(config, ports["taskgate"]))
        yield f"http://127.0.0.1:{ports['taskgate']}/mcp", taskgate.pid, token


async def open_streams(
    http: aiohttp.ClientSession, url: str, token: str, count: int
) -> list[aiohttp.ClientResponse]:
    """`count` held streams, each past its first relayed event."""
    hold = load.Request("tools/call", {"name": "hold", "arguments": {}}, name="hold", token=token)

    async def one() -> aiohttp.ClientResponse:
        response = await http.post(url, data=hold.body(), headers=hold.headers())
        if response.status != 200 or response.content_type != "text/event-stream":
            raise SystemExit(f"a held stream got {response.status} {response.content_type}")
        await response.content.readuntil(b"\n\n")  # the first event came through taskgate
        return response

    async with asyncio.timeout(OPEN_TIMEOUT_S):
        return await asyncio.gather(*(one() for _ in range(count)))


def measure(url: str, pid: int, request: load.Request, seconds: float) -> dict[str, Any]:
    cpu_before = load.cpu_s(pid)
    time.sleep(IDLE_S)  # the measured idle interval itself, not a wait for something
    idle_cpu = (load.cpu_s(pid) - cpu_before) / IDLE_S
    cpu_before = load.cpu_s(pid)
    argv, output = load.wrk(url, request, threads=2, connections=WRK_CONNECTIONS, seconds=seconds)
    result = load.parse_wrk(output)
    cpu = load.cpu_s(pid) - cpu_before
    return {
        "rss_kib": rss_kib(pid),
        "idle_cpu_share": round(idle_cpu, 4),
        "tasks_get": {
            "requests_per_s": result["requests_per_s"],
            "p50_ms": result["p50_ms"],
            "p99_ms": result["p99_ms"],
            "taskgate_cpu_us_per_request": round(1e6 * cpu / result["requests"], 1),
            "command": argv,
        },
    }


async def scenario(counts: list[int], seconds: float, work: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with started(work, limit=max(counts) + 256) as (url, pid, token):
        task_id = run.record_task(url, token)
        request = run.requests_for(task_id, token)["tasks/get"]
        baseline = rss_kib(pid)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            for count in counts:
                streams = await open_streams(http, url, token, count)
                row = await asyncio.to_thread(measure, url, pid, request, seconds)
                for response in streams:
                    response.close()
                row["streams"] = count
                results[str(count)] = row
                got = row["tasks_get"]
                print(
                    f"{count:6d} streams: rss {row['rss_kib'] / 1024:7.1f} MiB, idle CPU "
                    f"{100 * row['idle_cpu_share']:4.1f}%, tasks/get {got['requests_per_s']:8.0f}"
                    f"/s p50 {got['p50_ms']:.2f} ms p99 {got['p99_ms']:.2f} ms, "
                    f"{got['taskgate_cpu_us_per_request']:.0f} us CPU/request",
                    flush=True,
                )
        results["rss_kib_at_start"] = baseline
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="0,100,1000", help="stream counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=4.0, help="each wrk run")
    parser.add_argument("--json", type=Path, help="write every result here")
    args = parser.parse_args()
    counts = [int(n) for n in args.streams.split(",")]
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="taskgate-streams-") as work:
        results = asyncio.run(scenario(counts, args.seconds, Path(work)))
    elapsed = round(time.monotonic() - began, 1)
    print(f"elapsed {elapsed} s; stopped everything it started")
    if args.json:
        document = {"method": __doc__, "machine": load.machine(), "results": results}
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
