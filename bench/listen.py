"""Idle subscriptions/listen streams held by one taskgate process: memory, idle CPU, the
pollers' calls, and the delay of an emulated notifications/tasks (issue 13).

    python -m bench.listen [--streams 5000] [--tasks 5000] [--idle-s 20] [--delay-samples 200]
                           [--poll-ms 5000] [--fast-poll-ms 250] [--json out.json]

Starts on loopback, each as a process of its own, and stops them all by pid at the end (also on
a failure, Ctrl-C, SIGTERM or the run's time limit):

- the parking backend (this module, `--serve-backend`): an aiohttp MCP 2026-07-28 server whose
  tool `park` returns a task that waits in `input_required` (an elicitation in `inputRequests`,
  as the demo backend's generate_report does) until tasks/update answers it, then is
  `completed`. Its tasks live in a dict; tasks/get stamps `lastUpdatedAt` with the time of the
  read, as FastMCP 4.1.4 does; each task advertises the `pollIntervalMs` its creator asked for
  (default --poll-ms). GET /stats counts the calls it served; POST /gaps hands over (and
  forgets) the time between two tasks/get of one task, by pollIntervalMs. It stands in for the demo
  backend (FastMCP 4.1.4), which costs about 0.9 ms of CPU per tasks/get on this machine:
  5,000 tasks polled every 5 s would be about 1,000 tasks/get per second, most of one of the
  two cores, taken from taskgate while it is measured, and FastMCP cannot count its calls;
- taskgate, `python -m gateway run` (that is `taskgate run`), auth none, the SQLite store in a
  temp dir, limits raised above the counts asked for, one backend and the route `*` to it.

Before anything starts, the soft RLIMIT_NOFILE is raised to the hard limit; both processes
inherit it. Then, from this process (asyncio's default loop; one aiohttp session for the calls,
32 connections, another for the streams, one connection each):

1. N tasks are created through taskgate (tools/call `park`, 32 at once).
2. M listen streams are opened through taskgate, one connection each (64 opening at once),
   filter `taskIds`: stream j watches tasks j, j+M, j+2M, ... and task j mod N, so every task is
   watched by at least one stream. A stream counts as open once its acknowledgement has arrived
   (it must name every task asked for) and one snapshot of each task it watches (each poller's
   first tasks/get); every stream is read, all the time, until the end.
3. taskgate's VmRSS (/proc/<pid>/status) before the streams, once they are open, about once a
   second during --idle-s seconds of idleness and after them; the CPU time (/proc/<pid>/stat
   utime+stime) over those seconds of taskgate, the backend and this process, and what the rest
   of the machine used (/proc/stat); the tasks/get calls the backend served meanwhile, and the
   time between two of them for one task (the poll period as it really is).
4. Delay on the emulated path, twice: K of the idle tasks (at --poll-ms), then K new tasks at
   --fast-poll-ms, each watched by a stream of its own, while the M idle streams stay open. For
   each, one after the other with a fixed spacing (the interval / K, at least 20 ms, so the
   changes fall across a whole poll period), tasks/update goes directly to the backend (not
   through taskgate), which approves the task and answers the CLOCK_MONOTONIC time at which it
   changed it; the delay is from that instant to the one at which the matching
   notifications/tasks with status `completed` was read off a stream watching the task
   (CLOCK_MONOTONIC is one clock for every process of the machine). A poller asks no faster
   than max(pollIntervalMs, subscriptions.min_poll_interval_ms) and sleeps that long after each
   answer, so a change waits at most one period: that interval, plus the tasks/get itself, plus
   any stall of taskgate's event loop; the backend's period of the fast tasks is reported too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import aiohttp
import orjson
from aiohttp import web

from bench import load, procs
from gateway.protocol.sse import SSEDecoder
from tests.support.procs import free_ports

PROTOCOL = "2026-07-28"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
META = {
    "io.modelcontextprotocol/protocolVersion": PROTOCOL,
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION: {}}},
}
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
CHANGED_KEY = "bench/changedAtMonotonicNs"  # in the backend's tasks/update answer
APPROVE = {"action": "accept", "content": {"approved": True}}

CREATE_CONCURRENCY = 32
OPEN_CONCURRENCY = 64
CALL_TIMEOUT_S = 30.0  # one tools/call, tasks/update or stats call
MIN_SPACING_S = 0.02  # between two changes of the delay measurement
KEEPALIVE_S = 15.0  # taskgate's subscriptions.keepalive_s, its default
MIN_POLL_MS = 250  # taskgate's subscriptions.min_poll_interval_ms default (lowered for faster)
CAPACITY_SLACK = 64  # above every count, in taskgate's limits


class BenchError(RuntimeError):
    """Something other than what is measured went wrong: the run stops, nothing is reported
    (a RuntimeError, so that bench/procs.py shows the tail of each process's stderr)."""


# --- the parking backend (a process of its own) -------------------------------------------

TASKS: web.AppKey[dict[str, dict[str, Any]]] = web.AppKey("tasks")
CALLS: web.AppKey[Counter[str]] = web.AppKey("calls")
# pollIntervalMs -> the ms between two tasks/get of one task with it, the latest ones
GAPS: web.AppKey[dict[int, deque[float]]] = web.AppKey("gaps")
MAX_GAPS = 500_000
DEFAULT_POLL: web.AppKey[int] = web.AppKey("default_poll_ms")


def backend_app(poll_interval_ms: int) -> web.Application:
    app = web.Application()
    app[TASKS] = {}
    app[CALLS] = Counter()
    app[GAPS] = {}
    app[DEFAULT_POLL] = poll_interval_ms
    app.router.add_post("/mcp", _serve_mcp)
    app.router.add_get("/stats", _serve_stats)
    app.router.add_post("/gaps", _take_gaps)
    return app


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _view(task: dict[str, Any]) -> dict[str, Any]:
    """The task as tasks/get answers it, `lastUpdatedAt` stamped with the time of the read."""
    view = {k: v for k, v in task.items() if not k.endswith("_ns")}
    view["lastUpdatedAt"] = _now()
    return view


async def _serve_mcp(request: web.Request) -> web.Response:
    message = orjson.loads(await request.read())
    method, params = message.get("method"), message.get("params") or {}
    app = request.app
    app[CALLS][method] += 1
    tasks: dict[str, dict[str, Any]] = app[TASKS]
    task_id = params.get("taskId")
    task = tasks.get(task_id) if isinstance(task_id, str) else None
    result: dict[str, Any]
    if method == "server/discover":
        result = {
            "supportedVersions": [PROTOCOL],
            "capabilities": {"tools": {}, "extensions": {TASKS_EXTENSION: {}}},
            "ttlMs": 0,
            "cacheScope": "public",
        }
    elif method == "tools/list":
        schema = {"type": "object", "properties": {"pollIntervalMs": {"type": "integer"}}}
        result = {"tools": [{"name": "park", "inputSchema": schema}]}
    elif method == "tools/call" and params.get("name") == "park":
        arguments = params.get("arguments") or {}
        new_id = os.urandom(24).hex()
        stamp = _now()
        key = f"{new_id}:{os.urandom(8).hex()}"  # as the tasks extension mints them
        elicit = {
            "mode": "form",
            "message": "Approve the outline of the report?",
            "requestedSchema": {
                "type": "object",
                "properties": {"approved": {"type": "boolean"}},
                "required": ["approved"],
            },
        }
        tasks[new_id] = {
            "taskId": new_id,
            "status": "input_required",
            "createdAt": stamp,
            "lastUpdatedAt": stamp,
            "ttlMs": 3_600_000,
            "pollIntervalMs": int(arguments.get("pollIntervalMs", app[DEFAULT_POLL])),
            "inputRequests": {key: {"method": "elicitation/create", "params": elicit}},
        }
        result = {**_view(tasks[new_id]), "resultType": "task"}
    elif method == "tasks/get" and task is not None:
        now_ns = time.monotonic_ns()
        if "polled_ns" in task:
            gaps = app[GAPS].setdefault(task["pollIntervalMs"], deque(maxlen=MAX_GAPS))
            gaps.append((now_ns - task["polled_ns"]) / 1e6)
        task["polled_ns"] = now_ns
        result = _view(task)
    elif method == "tasks/update" and task is not None and params.get("inputResponses"):
        if task["status"] == "input_required":
            task.pop("inputRequests", None)
            task["status"] = "completed"
            task["result"] = {"content": [{"type": "text", "text": "approved"}]}
            task["changed_ns"] = time.monotonic_ns()
        result = {"_meta": {CHANGED_KEY: task.get("changed_ns")}}
    else:
        error = {"code": -32602, "message": "Task not found"}
        refusal = {"jsonrpc": "2.0", "id": message.get("id"), "error": error}
        return web.Response(status=400, body=orjson.dumps(refusal), content_type="application/json")
    result.setdefault("resultType", "complete")
    result.setdefault("_meta", {})["io.modelcontextprotocol/serverInfo"] = {
        "name": "parking",
        "version": "1",
    }
    body = orjson.dumps({"jsonrpc": "2.0", "id": message.get("id"), "result": result})
    return web.Response(body=body, content_type="application/json")


async def _serve_stats(request: web.Request) -> web.Response:
    calls: Counter[str] = request.app[CALLS]
    stats = {"calls": dict(calls), "tasks": len(request.app[TASKS])}
    return web.Response(body=orjson.dumps(stats), content_type="application/json")


async def _take_gaps(request: web.Request) -> web.Response:
    """The gaps recorded since the last call, by pollIntervalMs, and forget them."""
    recorded: dict[int, deque[float]] = request.app[GAPS]
    gaps = {str(interval): list(found) for interval, found in recorded.items()}
    recorded.clear()
    return web.Response(body=orjson.dumps(gaps), content_type="application/json")


def serve_backend(port: int, poll_interval_ms: int) -> None:
    web.run_app(
        backend_app(poll_interval_ms),
        host="127.0.0.1",
        port=port,
        print=None,
        access_log=None,
    )


# --- the client side ----------------------------------------------------------------------


def rpc_body(method: str, params: dict[str, Any], request_id: int | str) -> bytes:
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": method,
        "params": {**params, "_meta": META},
    }
    return orjson.dumps(body)


def rpc_headers(method: str, name: str | None = None) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": PROTOCOL,
        "Mcp-Method": method,
    }
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


async def rpc(
    http: aiohttp.ClientSession, url: str, method: str, params: dict[str, Any], name: str | None
) -> dict[str, Any]:
    """The result of one request; BenchError on anything else."""
    timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
    body, headers = rpc_body(method, params, 1), rpc_headers(method, name)
    async with http.post(url, data=body, headers=headers, timeout=timeout) as response:
        raw = await response.read()
    answer = orjson.loads(raw)
    if response.status != 200 or "result" not in answer:
        shown = raw[:400].decode(errors="replace")
        raise BenchError(f"{method} to {url} answered {response.status}: {shown}")
    result: dict[str, Any] = answer["result"]
    return result


async def create_tasks(
    http: aiohttp.ClientSession, url: str, count: int, poll_ms: int | None
) -> list[str]:
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)
    arguments = {} if poll_ms is None else {"pollIntervalMs": poll_ms}

    async def one() -> str:
        async with gate:
            params = {"name": "park", "arguments": arguments}
            created = await rpc(http, url, "tools/call", params, "park")
        if created.get("resultType") != "task":
            raise BenchError(f"park did not create a task through taskgate: {created}")
        task_id: str = created["taskId"]
        return task_id

    return list(await asyncio.gather(*(one() for _ in range(count))))


@dataclass
class Tally:
    """What every stream has read, shared: arrivals per (task, status), counts, failures."""

    first_snapshots_owed: int = 0
    all_first_snapshots: asyncio.Event = field(default_factory=asyncio.Event)
    arrival_ns: dict[tuple[str, str], int] = field(default_factory=dict)
    waiters: dict[tuple[str, str], asyncio.Future[int]] = field(default_factory=dict)
    first_snapshot: dict[str, dict[str, Any]] = field(default_factory=dict)
    notifications: int = 0
    keepalives: int = 0
    ended: int = 0
    problems: list[str] = field(default_factory=list)

    def expect(self, task_id: str, status: str) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.waiters[(task_id, status)] = future
        return future

    def problem(self, text: str) -> None:
        if len(self.problems) < 100:  # enough to tell what went wrong
            self.problems.append(text)

    def arrived(self, task_id: str, status: str, at_ns: int) -> None:
        key = (task_id, status)
        self.arrival_ns.setdefault(key, at_ns)
        future = self.waiters.pop(key, None)
        if future is not None and not future.done():
            future.set_result(at_ns)


class Counts(Protocol):
    """What a reader counts for every stream: keep-alive comments, streams that ended."""

    keepalives: int
    ended: int


class ListenReader:
    """One listen stream of this client: its request, its acknowledgement, its reader. A
    subclass says what it asks for (`wanted`) and what each message means (`_message`)."""

    def __init__(self, listen_id: int, counts: Counts) -> None:
        self.listen_id = listen_id
        self.counts = counts
        self.acknowledged: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.response: aiohttp.ClientResponse | None = None
        self.reader: asyncio.Task[None] | None = None

    def wanted(self) -> dict[str, Any]:
        raise NotImplementedError

    def _message(self, message: dict[str, Any], at_ns: int) -> None:
        raise NotImplementedError

    async def open(self, http: aiohttp.ClientSession, url: str) -> None:
        params = {"notifications": self.wanted()}
        body = rpc_body("subscriptions/listen", params, self.listen_id)
        response = await http.post(url, data=body, headers=rpc_headers("subscriptions/listen"))
        self.response = response
        if response.status != 200 or response.content_type != "text/event-stream":
            shown = (await response.read())[:400].decode(errors="replace")
            raise BenchError(f"a listen got {response.status} {response.content_type}: {shown}")
        self.reader = asyncio.create_task(self._read(response, SSEDecoder()))
        await self.acknowledged

    async def _read(self, response: aiohttp.ClientResponse, decoder: SSEDecoder) -> None:
        counts = self.counts
        try:
            while True:
                chunk = await response.content.readany()
                at_ns = time.monotonic_ns()  # the arrival of every event in this chunk
                if not chunk:
                    counts.ended += 1
                    if not self.acknowledged.done():
                        problem = f"stream {self.listen_id} ended before its acknowledgement"
                        self.acknowledged.set_exception(BenchError(problem))
                    return
                for frame in decoder.feed(chunk):
                    if frame.data is None:
                        counts.keepalives += frame.raw.startswith(b":")
                        continue
                    self._message(orjson.loads(frame.data), at_ns)
        except (aiohttp.ClientError, ConnectionError) as exc:
            counts.ended += 1
            if not self.acknowledged.done():
                self.acknowledged.set_exception(exc)

    def close(self) -> None:
        if self.response is not None:
            self.response.close()
        if self.reader is not None:
            self.reader.cancel()


class Watcher(ListenReader):
    """A stream watching `task_ids`: their first snapshots, then their arrivals."""

    def __init__(self, listen_id: int, task_ids: list[str], tally: Tally) -> None:
        super().__init__(listen_id, tally)
        self.task_ids = task_ids
        self.unseen = set(task_ids)  # tasks with no snapshot yet on this stream
        self.tally = tally

    def wanted(self) -> dict[str, Any]:
        return {"taskIds": self.task_ids}

    def _message(self, message: dict[str, Any], at_ns: int) -> None:
        tally = self.tally
        params = message.get("params") or {}
        if params.get("_meta", {}).get(SUBSCRIPTION_ID) != self.listen_id:
            tally.problem(f"stream {self.listen_id}: wrong subscriptionId: {message}")
        method = message.get("method")
        if not self.acknowledged.done():
            honoured = params.get("notifications", {}).get("taskIds")
            if method != "notifications/subscriptions/acknowledged":
                problem = f"stream {self.listen_id}: first event is not the acknowledgement"
                self.acknowledged.set_exception(BenchError(problem))
            elif sorted(honoured or []) != sorted(self.task_ids):
                problem = f"stream {self.listen_id}: acknowledged {honoured}, not its tasks"
                self.acknowledged.set_exception(BenchError(problem))
            else:
                self.acknowledged.set_result(None)
            return
        if method != "notifications/tasks":
            tally.problem(f"stream {self.listen_id}: unexpected {method}")
            return
        tally.notifications += 1
        task_id, status = params.get("taskId"), params.get("status")
        tally.arrived(str(task_id), str(status), at_ns)
        if task_id in self.unseen:
            self.unseen.discard(task_id)
            tally.first_snapshot.setdefault(task_id, params)
            tally.first_snapshots_owed -= 1
            if tally.first_snapshots_owed == 0:
                tally.all_first_snapshots.set()


def watch_plan(streams: int, task_ids: list[str]) -> list[list[str]]:
    """Stream j watches tasks j, j+M, j+2M, ... and task j mod N: every task is watched."""
    plan = []
    for j in range(streams):
        mine = dict.fromkeys(task_ids[j::streams])
        mine[task_ids[j % len(task_ids)]] = None
        plan.append(list(mine))
    return plan


async def open_streams(
    http: aiohttp.ClientSession, url: str, plan: list[list[str]], tally: Tally, first_id: int
) -> list[Watcher]:
    """Every stream of `plan`, each past its acknowledgement, then one snapshot of each task on
    each stream; bounded by the caller."""
    tally.first_snapshots_owed += sum(len(tasks) for tasks in plan)
    tally.all_first_snapshots.clear()
    watchers = [Watcher(first_id + j, tasks, tally) for j, tasks in enumerate(plan)]
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)

    async def one(watcher: Watcher) -> None:
        async with gate:
            await watcher.open(http, url)

    try:
        await asyncio.gather(*(one(w) for w in watchers))
        await tally.all_first_snapshots.wait()
    except BaseException:
        for watcher in watchers:
            watcher.close()
        raise
    return watchers


def percentile(samples: list[float], q: float) -> float:
    """Nearest rank, as bench/task_latency.py reads them."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def delays(
    http: aiohttp.ClientSession,
    backend_url: str,
    task_ids: list[str],
    tally: Tally,
    interval_s: float,
) -> dict[str, Any]:
    """Approve each task at the backend, spaced across a poll period; the delay of each to its
    `completed` event on a stream."""
    spacing = max(MIN_SPACING_S, interval_s / len(task_ids))
    bound_s = 2 * interval_s + CALL_TIMEOUT_S

    async def one(index: int, task_id: str) -> float:
        await asyncio.sleep(index * spacing)  # the schedule of the changes
        arrived = tally.expect(task_id, "completed")  # before the change: it may be quick
        key = next(iter(tally.first_snapshot[task_id]["inputRequests"]))
        params = {"taskId": task_id, "inputResponses": {key: APPROVE}}
        answer = await rpc(http, backend_url, "tasks/update", params, task_id)
        changed_ns = int(answer["_meta"][CHANGED_KEY])
        async with asyncio.timeout(bound_s):
            at_ns = await arrived
        return (at_ns - changed_ns) / 1e6

    began = time.monotonic()
    samples = list(await asyncio.gather(*(one(i, t) for i, t in enumerate(task_ids))))
    return {
        "samples": len(samples),
        "spacing_ms": round(spacing * 1000, 1),
        "min_ms": round(min(samples), 1),
        "p50_ms": round(percentile(samples, 0.50), 1),
        "p99_ms": round(percentile(samples, 0.99), 1),
        "max_ms": round(max(samples), 1),
        "elapsed_s": round(time.monotonic() - began, 1),
    }


# --- what is measured ---------------------------------------------------------------------


def status_kib(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field_name}:"):
            return int(line.split()[1])
    raise BenchError(f"no {field_name} for pid {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def backend_stats(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
    async with http.get(f"{base}/stats", timeout=timeout) as response:
        found: dict[str, Any] = orjson.loads(await response.read())
    return found


async def backend_gaps(http: aiohttp.ClientSession, base: str, interval_ms: int) -> dict[str, Any]:
    """p50, p99 and max of the backend's gaps between two tasks/get of one task, for the tasks
    of `interval_ms`, since the last time asked (the others are forgotten too)."""
    timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
    async with http.post(f"{base}/gaps", timeout=timeout) as response:
        found: dict[str, list[float]] = orjson.loads(await response.read())
    gaps = found.get(str(interval_ms), [])
    return {
        "samples": len(gaps),
        "p50": round(percentile(gaps, 0.50), 1) if gaps else None,
        "p99": round(percentile(gaps, 0.99), 1) if gaps else None,
        "max": round(max(gaps), 1) if gaps else None,
    }


def mib(kib: int) -> float:
    return round(kib / 1024, 1)


async def scenario(
    args: argparse.Namespace, taskgate_url: str, backend_base: str, pids: dict[str, int]
) -> dict[str, Any]:
    tg = pids["taskgate"]
    results: dict[str, Any] = {"rss_kib": {"at_start": status_kib(tg, "VmRSS")}}
    tally = Tally()
    watchers: list[Watcher] = []
    calls = aiohttp.TCPConnector(limit=CREATE_CONCURRENCY)
    held = aiohttp.TCPConnector(limit=0)  # one connection per listen stream, held open
    # A stream lasts the whole run: no total deadline on it (aiohttp's default is 300 s); the
    # phases' own timeouts and the run's time limit bound what waits on it.
    forever = aiohttp.ClientTimeout(total=None, sock_connect=CALL_TIMEOUT_S)
    async with (
        aiohttp.ClientSession(connector=calls) as http,
        aiohttp.ClientSession(connector=held, timeout=forever) as streams,
    ):
        try:
            began = time.monotonic()
            async with asyncio.timeout(60 + args.tasks * 0.05):
                task_ids = await create_tasks(http, taskgate_url, args.tasks, None)
            results["create_s"] = round(time.monotonic() - began, 1)
            results["rss_kib"]["tasks_recorded"] = status_kib(tg, "VmRSS")
            say(f"created {args.tasks} tasks through taskgate in {results['create_s']} s")

            plan = watch_plan(args.streams, task_ids)
            results["task_ids_per_stream_max"] = max(len(p) for p in plan)
            began = time.monotonic()
            async with asyncio.timeout(60 + args.streams * 0.05):
                watchers = await open_streams(streams, taskgate_url, plan, tally, 1)
            results["open_s"] = round(time.monotonic() - began, 1)
            say(
                f"opened {args.streams} listen streams in {results['open_s']} s, each past its "
                "acknowledgement and one snapshot per task it watches"
            )

            # The idle window: nothing happens but the pollers' calls and the keep-alives.
            results["rss_kib"]["streams_open"] = status_kib(tg, "VmRSS")
            results["taskgate_fds_streams_open"] = open_fds(tg)
            stats_before = await backend_stats(http, backend_base)
            await backend_gaps(http, backend_base, args.poll_ms)  # forget those before it
            cpu_before = {name: load.cpu_s(pid) for name, pid in pids.items()}
            busy_before = load.busy_cpu_s()
            events_before = (tally.notifications, tally.keepalives)
            began = time.monotonic()
            timeline = []  # (seconds into the window, VmRSS KiB), about once a second
            while (left := args.idle_s - (time.monotonic() - began)) > 0:
                await asyncio.sleep(min(1.0, left))  # the measured idle interval itself
                timeline.append((round(time.monotonic() - began, 1), status_kib(tg, "VmRSS")))
            window = time.monotonic() - began
            cpu = {name: load.cpu_s(pid) - cpu_before[name] for name, pid in pids.items()}
            cpu["other_processes"] = max(0.0, load.busy_cpu_s() - busy_before - sum(cpu.values()))
            stats_after = await backend_stats(http, backend_base)
            period = await backend_gaps(http, backend_base, args.poll_ms)
            results["rss_kib"]["after_idle"] = status_kib(tg, "VmRSS")
            results["rss_kib"]["peak_VmHWM"] = status_kib(tg, "VmHWM")
            gets = stats_after["calls"].get("tasks/get", 0) - stats_before["calls"].get(
                "tasks/get", 0
            )
            results["idle"] = {
                "window_s": round(window, 2),
                "cpu_s_per_s": {name: round(used / window, 4) for name, used in cpu.items()},
                "backend_tasks_get": gets,
                "backend_tasks_get_per_s": round(gets / window, 1),
                "poll_period_ms": period,
                "rss_kib_timeline": timeline,
                "notifications_received": tally.notifications - events_before[0],
                "keepalives_received": tally.keepalives - events_before[1],
            }
            say(f"idle {window:.1f} s measured")

            # Delay, at the idle tasks' interval, then at the fast one on tasks of their own.
            rng = random.Random(13)
            samples = min(args.delay_samples, args.tasks)
            sampled = rng.sample(task_ids, samples)
            async with asyncio.timeout(120 + 3 * args.poll_ms / 1000 + samples * 0.5):
                slow = await delays(
                    http, backend_base + "/mcp", sampled, tally, args.poll_ms / 1000
                )
            slow["poll_interval_ms"] = args.poll_ms
            slow["in_force_ms"] = max(args.poll_ms, min_poll_ms(args))
            results["delay_idle_interval"] = slow
            say(f"delay at pollIntervalMs {args.poll_ms}: p50 {slow['p50_ms']} ms")

            await backend_gaps(http, backend_base, args.fast_poll_ms)  # forget those before
            async with asyncio.timeout(120 + samples * 0.1):
                fast_ids = await create_tasks(http, taskgate_url, samples, args.fast_poll_ms)
                fast_plan = [[task_id] for task_id in fast_ids]
                watchers += await open_streams(
                    streams, taskgate_url, fast_plan, tally, args.streams + 1
                )
            async with asyncio.timeout(120 + 3 * args.fast_poll_ms / 1000 + samples * 0.5):
                fast = await delays(
                    http, backend_base + "/mcp", fast_ids, tally, args.fast_poll_ms / 1000
                )
            fast["poll_interval_ms"] = args.fast_poll_ms
            fast["in_force_ms"] = max(args.fast_poll_ms, min_poll_ms(args))
            fast["poll_period_ms"] = await backend_gaps(http, backend_base, args.fast_poll_ms)
            results["delay_fast_interval"] = fast
            results["rss_kib"]["end"] = status_kib(tg, "VmRSS")
            results["rss_kib"]["peak_VmHWM"] = status_kib(tg, "VmHWM")
            results["streams_ended_early"] = tally.ended
            results["problems"] = tally.problems[:20]
            if tally.ended or tally.problems:
                raise BenchError(
                    f"streams ended early: {tally.ended}; problems: {tally.problems[:5]}"
                )
        finally:
            for watcher in watchers:
                watcher.close()
    return results


# --- the run ------------------------------------------------------------------------------


def say(text: str) -> None:
    print(f"  .. {text}", flush=True)


def min_poll_ms(args: argparse.Namespace) -> int:
    return min(MIN_POLL_MS, int(args.fast_poll_ms), int(args.poll_ms))


def raise_fd_limit() -> dict[str, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    now, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {"soft_before": soft, "soft": now, "hard": hard}


def taskgate_config(
    args: argparse.Namespace, work: Path, port: int, backend: str
) -> dict[str, Any]:
    streams = args.streams + args.delay_samples + CAPACITY_SLACK
    per_stream = -(-args.tasks // args.streams)
    return {
        "listen": {"host": "127.0.0.1", "port": port, "max_connections": streams + 1024},
        "store": {"url": f"sqlite:///{work}/routes.db", "cache_size": max(10_000, 2 * streams)},
        "auth": {"mode": "none"},
        "backends": {"parking": {"replicas": [backend]}},
        "routes": [{"tools": ["*"], "backend": "parking"}],
        "subscriptions": {
            "max_streams": streams,
            "max_streams_per_principal": streams,
            "max_task_ids": min(10_000, max(100, per_stream)),
            "max_pollers": args.tasks + args.delay_samples + CAPACITY_SLACK,
            "keepalive_s": KEEPALIVE_S,
            "min_poll_interval_ms": min_poll_ms(args),
        },
    }


@contextlib.contextmanager
def started(args: argparse.Namespace, work: Path) -> Iterator[dict[str, Any]]:
    ports = dict(zip(("backend", "taskgate"), free_ports(2), strict=True))
    backend_base = f"http://127.0.0.1:{ports['backend']}"
    with contextlib.ExitStack() as stack:
        backend_argv = [sys.executable, "-m", "bench.listen", "--serve-backend"]
        backend_argv += ["--port", str(ports["backend"]), "--poll-ms", str(args.poll_ms)]
        backend = stack.enter_context(procs.started(backend_argv, ports["backend"]))
        settings = taskgate_config(args, work, ports["taskgate"], f"{backend_base}/mcp")
        config = work / "taskgate.yaml"
        config.write_text(json.dumps(settings, indent=2) + "\n")  # JSON is YAML
        taskgate = stack.enter_context(procs.taskgate(config, ports["taskgate"]))
        procs_started: dict[str, subprocess.Popen[bytes]] = {
            "backend": backend,
            "taskgate": taskgate,
        }
        yield {
            "taskgate_url": f"http://127.0.0.1:{ports['taskgate']}/mcp",
            "backend_base": backend_base,
            "pids": {name: proc.pid for name, proc in procs_started.items()},
            "commands": {name: load.argv_of(proc) for name, proc in procs_started.items()},
            "taskgate_config": settings,
        }


def _stop(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(f"bench.listen: {signal.Signals(signum).name}; stopping everything it started")


def report(args: argparse.Namespace, document: dict[str, Any]) -> None:
    m, r, run = document["machine"], document["results"], document["setup"]
    rss = r["rss_kib"]
    idle = r["idle"]
    cpu = idle["cpu_s_per_s"]
    sub = run["taskgate_config"]["subscriptions"]
    print()
    print("bench.listen: idle subscriptions/listen streams in one taskgate process")
    print(
        f"machine: {m['nproc']} CPUs (os.cpu_count()), {m['cpu_model']}, {m['platform']}; "
        f"load average at start {', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}"
    )
    print(
        f"versions: Python {m['python']}, aiohttp {m['aiohttp']}, uvloop {m['uvloop']}, "
        f"taskgate {m['taskgate']} (commit {m['source']['commit'][:12]}, "
        f"{len(m['source']['gateway_changes_not_committed'])} files in gateway/ not committed)"
    )
    fd = document["fd_limit"]
    print(
        f"file descriptors: RLIMIT_NOFILE soft {fd['soft_before']} -> {fd['soft']} "
        f"(hard {fd['hard']}), inherited by both processes"
    )
    for name, argv in run["commands"].items():
        print(f"{name} (pid {run['pids'][name]}): {' '.join(argv)}")
    print(
        f"parameters: --streams {args.streams} --tasks {args.tasks} --idle-s {args.idle_s:g} "
        f"--delay-samples {args.delay_samples} --poll-ms {args.poll_ms} "
        f"--fast-poll-ms {args.fast_poll_ms}; at most {r['task_ids_per_stream_max']} taskIds "
        f"per stream; taskgate: auth none, SQLite store, subscriptions "
        f"{json.dumps(sub, separators=(',', ':'))}"
    )
    print(
        f"setup: {args.tasks} tasks created through taskgate in {r['create_s']} s "
        f"({CREATE_CONCURRENCY} at once); {args.streams} streams opened in {r['open_s']} s "
        f"({OPEN_CONCURRENCY} at once), each past its acknowledgement and a first snapshot of "
        f"every task it watches; taskgate then held {r['taskgate_fds_streams_open']} fds"
    )
    added = rss["streams_open"] - rss["tasks_recorded"]
    print(
        f"taskgate VmRSS: {mib(rss['at_start'])} MiB at start, {mib(rss['tasks_recorded'])} MiB "
        f"with the tasks recorded (before the streams), {mib(rss['streams_open'])} MiB with "
        f"the streams open, {mib(rss['after_idle'])} MiB after {idle['window_s']} s idle, "
        f"{mib(rss['end'])} MiB at the end; peak (VmHWM) {mib(rss['peak_VmHWM'])} MiB"
    )
    timeline = idle["rss_kib_timeline"]
    marks = timeline[:: max(1, len(timeline) // 8)] + ([timeline[-1]] if len(timeline) > 8 else [])
    shown = ", ".join(f"{t:g} s {mib(kib)}" for t, kib in dict(marks).items())
    print(f"  VmRSS in the idle window (MiB): {shown}")
    print(
        f"  streams and their pollers added {mib(added)} MiB: "
        f"{added / args.streams:.1f} KiB per stream (with {args.tasks} pollers, "
        f"{added / max(args.streams, args.tasks):.1f} KiB per stream-and-poller)"
    )
    print(
        f"idle CPU over {idle['window_s']} s: taskgate {cpu['taskgate']:.3f} CPU-s/s "
        f"({100 * cpu['taskgate']:.1f}% of one core); backend {cpu['backend']:.3f} CPU-s/s; "
        f"this client {cpu['client']:.3f} CPU-s/s; other processes of the machine "
        f"{cpu['other_processes']:.3f} CPU-s/s{' (!)' if cpu['other_processes'] > 0.1 else ''}"
    )
    expected = args.tasks / (max(args.poll_ms, sub["min_poll_interval_ms"]) / 1000)
    print(
        f"pollers' calls: the backend served {idle['backend_tasks_get']} tasks/get in the "
        f"window, {idle['backend_tasks_get_per_s']}/s ({args.tasks} tasks / "
        f"{args.poll_ms / 1000:g} s = {expected:.0f}/s expected); "
        f"{1e6 * cpu['taskgate'] / max(idle['backend_tasks_get_per_s'], 1e-9):.0f} us of "
        f"taskgate CPU per poll, keep-alives included"
    )
    if args.idle_s < 2 * args.poll_ms / 1000:
        print("  (the window is under two poll intervals: the count depends on where polls fall)")
    period = idle["poll_period_ms"]
    print(
        f"  the period between two tasks/get of one task, at the backend: p50 {period['p50']} "
        f"ms, p99 {period['p99']} ms, max {period['max']} ms ({period['samples']} gaps)"
    )
    print(
        f"  during the window the streams received {idle['notifications_received']} "
        f"notifications and {idle['keepalives_received']} keep-alive comments "
        f"(subscriptions.keepalive_s {sub['keepalive_s']:g})"
    )
    for key, label in (("delay_idle_interval", "idle tasks"), ("delay_fast_interval", "fast")):
        d = r[key]
        print(
            f"delay backend change -> client event ({label}, pollIntervalMs {d['poll_interval_ms']}"
            f", in force {d['in_force_ms']} ms): p50 {d['p50_ms']} ms, p99 {d['p99_ms']} ms "
            f"(min {d['min_ms']}, max {d['max_ms']}; {d['samples']} samples, one change every "
            f"{d['spacing_ms']} ms)"
        )
        if "poll_period_ms" in d:
            period = d["poll_period_ms"]
            print(
                f"  the period between two tasks/get of one of these tasks meanwhile: p50 "
                f"{period['p50']} ms, p99 {period['p99']} ms, max {period['max']} ms"
            )
    print(
        "  a change waits for its task's next poll: at most one period, which is the interval "
        "in force plus the tasks/get itself plus any stall of taskgate's event loop"
    )
    print(f"elapsed {document['elapsed_s']} s; stopped every process it started")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=5000)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--delay-samples", type=int, default=200)
    parser.add_argument("--poll-ms", type=int, default=5000, help="the idle tasks' pollIntervalMs")
    parser.add_argument("--fast-poll-ms", type=int, default=250, help="the delay's second part")
    parser.add_argument("--json", type=Path, help="write every result here")
    parser.add_argument("--serve-backend", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_backend:
        serve_backend(args.port, args.poll_ms)
        return
    if min(args.streams, args.tasks, args.delay_samples) < 1:
        raise SystemExit("--streams, --tasks and --delay-samples must be at least 1")
    import gateway

    fd_limit = raise_fd_limit()
    needed = args.streams + args.delay_samples + 1024
    if fd_limit["soft"] < needed:
        raise SystemExit(f"RLIMIT_NOFILE {fd_limit['soft']} is below the {needed} fds needed")
    machine = load.machine()
    machine.pop("wrk", None)
    machine.update(
        uvloop=metadata.version("uvloop"),
        taskgate=gateway.__version__,
        source=load.source("gateway", "bench"),
    )
    # The whole run's time limit; SIGALRM and SIGTERM stop everything it started.
    limit = 600 + 0.2 * (args.streams + args.tasks) + args.idle_s + 0.02 * args.poll_ms
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGALRM, _stop)
    signal.alarm(int(limit))
    began = time.monotonic()
    print(f"bench.listen: {args.streams} streams over {args.tasks} tasks", flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="taskgate-listen-") as work,
        started(args, Path(work)) as setup,
    ):
        pids = {**setup["pids"], "client": os.getpid()}
        say(f"taskgate pid {pids['taskgate']}, backend pid {pids['backend']}")
        results = asyncio.run(scenario(args, setup["taskgate_url"], setup["backend_base"], pids))
    signal.alarm(0)
    document: dict[str, Any] = {
        "method": __doc__,
        "machine": machine,
        "fd_limit": fd_limit,
        "parameters": {k: v for k, v in vars(args).items() if k not in ("serve_backend", "port")},
        "setup": setup,
        "results": results,
        "elapsed_s": round(time.monotonic() - began, 1),
    }
    report(args, document)
    if args.json:
        document["parameters"]["json"] = str(args.json)
        args.json.write_text(json.dumps(document, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
