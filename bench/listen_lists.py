"""The delay of a backend's own tools/list_changed: from the backend's change to the client's
event, read directly on the replica's listen and through taskgate, side by side (issue 24).

    python -m bench.listen_lists [--samples 100] [--replicas 2] [--spacing-ms 50] [--json out]

Starts on loopback, each as a process of its own, and stops them all by pid at the end (also on
a failure, Ctrl-C, SIGTERM or the run's time limit):

- --replicas R replicas of the listing backend, `python -m backends.listing --port 0 --replica
  lN` (the `mcp` SDK's MCPServer: its tool `set_tool(tool, on)` adds a tool and pushes
  `notifications/tools/list_changed` to the replica's listen streams; started as the tests start
  it, tests/support/listing.py);
- taskgate, `python -m gateway run`, auth none, the SQLite store in a temp dir, the backend
  `lists` with the R replicas and the route `bench_*` to it, `discovery.refresh_s` 60: its digest
  polling cannot explain an event within the run's bound, only its upstream list listen
  (gateway/listen/list_listens.py) can.

From this process (asyncio's default loop, aiohttp): one listen (`toolsListChanged`) directly on
each replica and one through taskgate, each past its acknowledgement; then, once taskgate's own
list listens are settled (one acknowledgement read back through a first change, discarded),
S samples one after another, --spacing-ms apart: sample i sends `set_tool("bench_<i>", on)` to
replica i mod R DIRECTLY, on a new connection, and measures on CLOCK_MONOTONIC, from just before
the call is sent, the arrival of that replica's own tools/list_changed on the direct stream and
of the one taskgate sends on its stream; then makes the same change on the other replicas (they
serve the same tools again; not measured) and waits for their direct events. taskgate must send
exactly one event per sample: any more are counted and reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
import orjson

from bench import load, procs
from bench.listen import BenchError, percentile, rpc, rpc_body, rpc_headers, say
from gateway.protocol.sse import SSEDecoder
from tests.support.listing import ListingBackendProcess
from tests.support.procs import free_ports

EVENT_TIMEOUT_S = 10.0  # one sample's event; the catalogue's refresh is 60 s
REFRESH_S = 60.0
TOOLS_CHANGED = "notifications/tools/list_changed"
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"


class Stream:
    """One listen stream (toolsListChanged): the arrival time of each list_changed, queued."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.arrivals: asyncio.Queue[int] = asyncio.Queue()
        self.acknowledged: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.response: aiohttp.ClientResponse | None = None
        self.reader: asyncio.Task[None] | None = None

    async def open(self, http: aiohttp.ClientSession, url: str, listen_id: int) -> None:
        params = {"notifications": {"toolsListChanged": True}}
        body = rpc_body("subscriptions/listen", params, listen_id)
        response = await http.post(url, data=body, headers=rpc_headers("subscriptions/listen"))
        self.response = response
        if response.status != 200 or response.content_type != "text/event-stream":
            shown = (await response.read())[:400].decode(errors="replace")
            raise BenchError(f"{self.label}: listen got {response.status}: {shown}")
        self.reader = asyncio.create_task(self._read(response))
        async with asyncio.timeout(EVENT_TIMEOUT_S):
            await self.acknowledged

    async def _read(self, response: aiohttp.ClientResponse) -> None:
        decoder = SSEDecoder()
        while True:
            chunk = await response.content.readany()
            at_ns = time.monotonic_ns()
            if not chunk:
                if not self.acknowledged.done():
                    self.acknowledged.set_exception(BenchError(f"{self.label} ended"))
                return
            for frame in decoder.feed(chunk):
                if frame.data is None:
                    continue
                method = orjson.loads(frame.data).get("method")
                if method == ACKNOWLEDGED and not self.acknowledged.done():
                    self.acknowledged.set_result(None)
                elif method == TOOLS_CHANGED:
                    self.arrivals.put_nowait(at_ns)

    async def next_arrival(self) -> int:
        async with asyncio.timeout(EVENT_TIMEOUT_S):
            return await self.arrivals.get()

    def close(self) -> None:
        if self.response is not None:
            self.response.close()
        if self.reader is not None:
            self.reader.cancel()


async def set_tool(url: str, tool: str) -> None:
    """`set_tool(tool, on)` on one replica, on a connection of its own."""
    async with aiohttp.ClientSession() as fresh:
        params = {"name": "set_tool", "arguments": {"tool": tool, "on": True}}
        result = await rpc(fresh, url, "tools/call", params, "set_tool")
    if result.get("isError"):
        raise BenchError(f"set_tool at {url}: {result}")


def summary(samples_ms: list[float]) -> dict[str, Any]:
    return {
        "samples": len(samples_ms),
        "p50_ms": round(percentile(samples_ms, 0.5), 3),
        "p90_ms": round(percentile(samples_ms, 0.9), 3),
        "p99_ms": round(percentile(samples_ms, 0.99), 3),
        "min_ms": round(min(samples_ms), 3),
        "max_ms": round(max(samples_ms), 3),
    }


async def scenario(
    args: argparse.Namespace, taskgate_url: str, replica_urls: list[str]
) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
        direct = [Stream(f"direct l{i + 1}") for i in range(len(replica_urls))]
        through = Stream("taskgate")
        for index, (stream, url) in enumerate(zip(direct, replica_urls, strict=True)):
            await stream.open(http, url, index + 1)
        await through.open(http, taskgate_url, 100)
        try:
            # A first change, not measured: taskgate's own list listens are acknowledged (each
            # acknowledgement refreshes), and the change's event has come through. What the
            # listens' first refreshes may still send is left a second to come, and dropped.
            await change_everywhere(replica_urls, direct, "bench_warmup", skip=None)
            await through.next_arrival()
            await asyncio.sleep(1.0)  # the warm-up's tail, not a synchronisation
            warmup_extra = drain(through)
            direct_ms: list[float] = []
            taskgate_ms: list[float] = []
            extra = 0
            began = time.monotonic()
            for i in range(args.samples):
                first = i % len(replica_urls)
                sent = time.monotonic_ns()
                await set_tool(replica_urls[first], f"bench_{i}")
                direct_at, through_at = await asyncio.gather(
                    direct[first].next_arrival(), through.next_arrival()
                )
                direct_ms.append((direct_at - sent) / 1e6)
                taskgate_ms.append((through_at - sent) / 1e6)
                await change_everywhere(replica_urls, direct, f"bench_{i}", skip=first)
                await asyncio.sleep(args.spacing_ms / 1000)  # the samples' spacing
                extra += drain(through)
            elapsed = time.monotonic() - began
        finally:
            for stream in (*direct, through):
                stream.close()
    difference = [t - d for t, d in zip(taskgate_ms, direct_ms, strict=True)]
    return {
        "direct": summary(direct_ms),
        "taskgate": summary(taskgate_ms),
        "difference": summary(difference),
        "extra_taskgate_events": extra,
        "warmup_extra_taskgate_events": warmup_extra,
        "elapsed_s": round(elapsed, 1),
    }


async def change_everywhere(
    urls: list[str], direct: list[Stream], tool: str, *, skip: int | None
) -> None:
    """`tool` added on every replica but `skip` (which has it), each replica's own event read
    off its direct stream."""
    for index, url in enumerate(urls):
        if index == skip:
            continue
        await set_tool(url, tool)
        await direct[index].next_arrival()


def drain(stream: Stream) -> int:
    """Drop the events `stream` holds; how many."""
    count = 0
    while not stream.arrivals.empty():
        stream.arrivals.get_nowait()
        count += 1
    return count


def taskgate_config(work: Path, port: int, replicas: list[str]) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "store": {"url": f"sqlite:///{work}/routes.db"},
        "auth": {"mode": "none"},
        "discovery": {"refresh_s": REFRESH_S},
        "backends": {"lists": {"replicas": replicas}},
        "routes": [{"tools": ["bench_*"], "backend": "lists"}],
    }


@contextlib.contextmanager
def started(args: argparse.Namespace, work: Path) -> Iterator[dict[str, Any]]:
    (port,) = free_ports(1)
    backends = [ListingBackendProcess(f"l{i + 1}") for i in range(args.replicas)]
    try:
        for backend in backends:
            backend.start()
        urls = [backend.url for backend in backends]
        settings = taskgate_config(work, port, urls)
        config = work / "taskgate.yaml"
        config.write_text(json.dumps(settings, indent=2) + "\n")  # JSON is YAML
        with procs.taskgate(config, port) as taskgate:
            yield {
                "taskgate_url": f"http://127.0.0.1:{port}/mcp",
                "replica_urls": urls,
                "pids": {
                    "taskgate": taskgate.pid,
                    **{backend.name: backend.pid for backend in backends},
                },
                "commands": {
                    "taskgate": load.argv_of(taskgate),
                    **{backend.name: backend.argv for backend in backends},
                },
                "taskgate_config": settings,
            }
    except RuntimeError:
        for backend in backends:
            sys.stderr.write(f"{backend.name} stderr:\n{backend.log_text()[-2000:]}\n")
        raise
    finally:
        for backend in backends:
            backend.cleanup()  # SIGTERM by pid, SIGKILL after 10 s


def _stop(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(f"bench.listen_lists: {signal.Signals(signum).name}; stopping everything")


def line(label: str, found: dict[str, Any]) -> str:
    return (
        f"{label}: p50 {found['p50_ms']:.2f} ms, p90 {found['p90_ms']:.2f} ms, p99 "
        f"{found['p99_ms']:.2f} ms (min {found['min_ms']:.2f}, max {found['max_ms']:.2f}; "
        f"{found['samples']} samples)"
    )


def report(args: argparse.Namespace, document: dict[str, Any]) -> None:
    m, r = document["machine"], document["results"]
    print()
    print("bench.listen_lists: backend set_tool -> tools/list_changed, direct and through taskgate")
    print(
        f"machine: {m['nproc']} CPUs, {m['cpu_model']}, {m['platform']}; load average at start "
        f"{', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}"
    )
    print(
        f"versions: Python {m['python']}, aiohttp {m['aiohttp']}, mcp {m['mcp']}, taskgate "
        f"{m['taskgate']} (commit {m['source']['commit'][:12]}, "
        f"{len(m['source']['gateway_changes_not_committed'])} files in gateway/ not committed)"
    )
    for name, argv in document["setup"]["commands"].items():
        print(f"{name} (pid {document['setup']['pids'][name]}): {' '.join(argv)}")
    print(
        f"parameters: --samples {args.samples} --replicas {args.replicas} --spacing-ms "
        f"{args.spacing_ms:g}; taskgate: auth none, SQLite store, discovery.refresh_s "
        f"{REFRESH_S:g} (its polling cannot explain an event within {EVENT_TIMEOUT_S:g} s)"
    )
    print(line("direct, call sent -> the replica's own event read", r["direct"]))
    print(line("through taskgate, call sent -> taskgate's event read", r["taskgate"]))
    print(line("difference per sample, taskgate - direct", r["difference"]))
    print(
        f"taskgate sent {r['extra_taskgate_events']} events beyond one per sample (and "
        f"{r['warmup_extra_taskgate_events']} after the warm-up change); samples took "
        f"{r['elapsed_s']} s; elapsed {document['elapsed_s']} s; stopped every process it started"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--spacing-ms", type=float, default=50.0, help="between two samples")
    parser.add_argument("--json", type=Path, help="write every result here")
    args = parser.parse_args()
    if args.samples < 1 or not 1 <= args.replicas <= 8:
        raise SystemExit("--samples must be at least 1, --replicas 1 to 8")
    import gateway

    machine = load.machine()
    machine.pop("wrk", None)
    machine.update(
        mcp=metadata.version("mcp"),
        taskgate=gateway.__version__,
        source=load.source("gateway", "backends", "bench"),
    )
    limit = 120 + args.samples * (args.replicas * EVENT_TIMEOUT_S / 10 + args.spacing_ms / 1000)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGALRM, _stop)
    signal.alarm(int(limit))
    began = time.monotonic()
    print(f"bench.listen_lists: {args.samples} changes, {args.replicas} replicas", flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="taskgate-listen-lists-") as work,
        started(args, Path(work)) as setup,
    ):
        say(f"taskgate pid {setup['pids']['taskgate']}")
        results = asyncio.run(scenario(args, setup["taskgate_url"], setup["replica_urls"]))
    signal.alarm(0)
    document: dict[str, Any] = {
        "method": __doc__,
        "machine": machine,
        "parameters": {k: v for k, v in vars(args).items() if k != "json"},
        "client_pid": os.getpid(),
        "setup": setup,
        "results": results,
        "elapsed_s": round(time.monotonic() - began, 1),
    }
    report(args, document)
    if args.json:
        args.json.write_text(json.dumps(document, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
