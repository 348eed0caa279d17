"""The delay of a pushed notifications/tasks through taskgate: from a backend's change to the
client's event, on the upstream path of subscriptions/listen (issue 13).

    python -m bench.listen_push [--tasks 200] [--samples 200] [--streams 1] [--idle-streams 0]
                                [--spacing-ms 20] [--advance-keepalive]
                                [--json out.json]

Starts on loopback, each as a process of its own, and stops them all by pid at the end (also on
a failure, Ctrl-C, SIGTERM or the run's time limit):

- one replica of the pushing backend, `python -m backends.pushing --port 0 --replica p1` (the
  `mcp` SDK's MCPServer with a small Tasks extension; started as the tests start it,
  tests/support/procs.py PushingBackendProcess, which reads the port off its READY line): its
  tool `long_job` creates a task, `advance(task_id, status)` moves one and pushes
  `notifications/tasks` to the replica's listen streams that acknowledged its id, and
  `jobs_stats` counts the tasks/get it was sent;
- taskgate, `python -m gateway run` (that is `taskgate run`), auth none, the SQLite store in a
  temp dir, the one backend `jobs` with its one replica and the route `*` to it, limits raised
  above the counts asked for. The backend declares the tasks extension and `listChanged`
  (gateway/catalog/capabilities.py `may_push_tasks`), so taskgate opens a listen of its own on
  the owning replica for the task ids of each client listen (gateway/listen/upstream.py) and
  relays what it pushes; it polls none of them.

Before anything starts, the soft RLIMIT_NOFILE is raised to the hard limit; both processes
inherit it. Then, from this process (asyncio's default loop; aiohttp sessions: one for the
calls, 32 connections, one for the streams, one connection each, one for the advance calls):

1. --idle-streams M listen streams are opened through taskgate first, filter
   `toolsListChanged` only (64 opening at once), each past its acknowledgement, and read until
   the end: the load the measurement runs beside. They open no upstream listen.
2. N tasks are created through taskgate (tools/call `long_job`, 32 at once).
3. --streams S listen streams are opened through taskgate, filter `taskIds`, stream j watching
   tasks j, j+S, j+2S, ...; a stream counts as open once its acknowledgement (naming every task
   it asked for) and one snapshot of each of its tasks (status `working`, from the one tasks/get
   taskgate makes per pushed task at open) have arrived.
4. K samples, strictly one after another, --spacing-ms apart (from one's end to the next's
   start): `advance(task_id, status)` is sent to the backend DIRECTLY (not through taskgate);
   sample i moves task i mod N to `input_required` (to `working` and back on later rounds when
   K > N). Measured, each on CLOCK_MONOTONIC in this one process: the delay, from just before
   the call is sent to the moment the matching notifications/tasks (that task, that status) is
   read off the client's stream; and the round trip of the advance call itself, to its answer.
   Each advance goes on a new connection (its connect is in both times): on a kept-alive one
   (--advance-keepalive) the backend's answer waits about 40 ms, because its uvicorn writes an
   answer's head and body in two sends on an accepted socket it never sets TCP_NODELAY on (seen
   with strace), so Nagle holds the body until this client's delayed ACK of the head; a new
   connection starts in quick-ACK mode. That stall is the backend's, in the answer only.
   The backend pushes while it answers, so the event may arrive before the answer; the
   difference (delay minus round trip, per sample) is reported too. Each event must equal the
   task `advance` answered (less `_meta`), carry the client's subscriptionId, and no other event
   may arrive.
5. The backend's tasks/get count (`jobs_stats`) at start, once the tasks are created, once the
   listens are open (N more: one per task, taskgate's snapshot at open) and after the samples
   (no more: nothing is polled), and the listen streams the replica holds.
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
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
import orjson

from bench import load, procs
from bench.listen import (
    CALL_TIMEOUT_S,
    SUBSCRIPTION_ID,
    BenchError,
    ListenReader,
    percentile,
    raise_fd_limit,
    rpc,
    rpc_body,
    rpc_headers,
    say,
)
from tests.support.procs import PushingBackendProcess, free_ports

CREATE_CONCURRENCY = 32
OPEN_CONCURRENCY = 64
EVENT_TIMEOUT_S = 10.0  # one sample's event, after its advance was answered
KEEPALIVE_S = 15.0  # taskgate's subscriptions.keepalive_s, its default
CAPACITY_SLACK = 64  # above every count, in taskgate's limits
IDLE_FIRST_ID = 1_000_000  # the idle streams' listen ids; the watching ones count from 1
TASKS = "notifications/tasks"
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"


@dataclass
class Tally:
    """What every stream has read, shared: the waiters for events, counts, failures."""

    first_snapshots_owed: int = 0
    all_first_snapshots: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: dict[tuple[str, str], asyncio.Future[tuple[int, dict[str, Any]]]] = field(
        default_factory=dict
    )
    notifications: int = 0
    keepalives: int = 0
    ended: int = 0
    problems: list[str] = field(default_factory=list)

    def expect(self, task_id: str, status: str) -> asyncio.Future[tuple[int, dict[str, Any]]]:
        future: asyncio.Future[tuple[int, dict[str, Any]]] = (
            asyncio.get_running_loop().create_future()
        )
        self.waiters[(task_id, status)] = future
        return future

    def problem(self, text: str) -> None:
        if len(self.problems) < 100:  # enough to tell what went wrong
            self.problems.append(text)


class Watcher(ListenReader):
    """With `task_ids` it watches them; without, it asks for toolsListChanged only and stays
    idle."""

    def __init__(self, listen_id: int, task_ids: list[str], tally: Tally) -> None:
        super().__init__(listen_id, tally)
        self.task_ids = task_ids
        self.unseen = set(task_ids)  # tasks with no snapshot yet on this stream
        self.tally = tally

    def wanted(self) -> dict[str, Any]:
        if self.task_ids:
            return {"taskIds": self.task_ids}
        return {"toolsListChanged": True}

    def _message(self, message: dict[str, Any], at_ns: int) -> None:
        tally = self.tally
        params = message.get("params") or {}
        if params.get("_meta", {}).get(SUBSCRIPTION_ID) != self.listen_id:
            tally.problem(f"stream {self.listen_id}: wrong subscriptionId: {message}")
        method = message.get("method")
        if not self.acknowledged.done():
            honoured = params.get("notifications", {})
            if method != ACKNOWLEDGED:
                problem = f"stream {self.listen_id}: first event is not the acknowledgement"
                self.acknowledged.set_exception(BenchError(problem))
            elif self.task_ids and sorted(honoured.get("taskIds") or []) != sorted(self.task_ids):
                problem = f"stream {self.listen_id}: acknowledged {honoured}, not its tasks"
                self.acknowledged.set_exception(BenchError(problem))
            elif not self.task_ids and honoured != {"toolsListChanged": True}:
                problem = f"stream {self.listen_id}: acknowledged {honoured}"
                self.acknowledged.set_exception(BenchError(problem))
            else:
                self.acknowledged.set_result(None)
            return
        if method != TASKS or not self.task_ids:
            tally.problem(f"stream {self.listen_id}: unexpected {method}")
            return
        tally.notifications += 1
        task_id, status = str(params.get("taskId")), str(params.get("status"))
        if task_id in self.unseen:
            self.unseen.discard(task_id)
            if status != "working":
                tally.problem(f"stream {self.listen_id}: first snapshot of {task_id} is {status}")
            tally.first_snapshots_owed -= 1
            if tally.first_snapshots_owed == 0:
                tally.all_first_snapshots.set()
            return
        future = tally.waiters.pop((task_id, status), None)
        if future is None or future.done():
            tally.problem(f"stream {self.listen_id}: an event nobody waited for: {params}")
            return
        future.set_result((at_ns, {k: v for k, v in params.items() if k != "_meta"}))


async def open_streams(
    http: aiohttp.ClientSession, url: str, plan: list[list[str]], tally: Tally, first_id: int
) -> list[Watcher]:
    """Every stream of `plan`, each past its acknowledgement, then (for those that watch tasks)
    one snapshot of each task; bounded by the caller."""
    tally.first_snapshots_owed += sum(len(tasks) for tasks in plan)
    if tally.first_snapshots_owed:
        tally.all_first_snapshots.clear()
    watchers = [Watcher(first_id + j, tasks, tally) for j, tasks in enumerate(plan)]
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)

    async def one(watcher: Watcher) -> None:
        async with gate:
            await watcher.open(http, url)

    try:
        await asyncio.gather(*(one(w) for w in watchers))
        if tally.first_snapshots_owed:
            await tally.all_first_snapshots.wait()
    except BaseException:
        for watcher in watchers:
            watcher.close()
        raise
    return watchers


async def create_tasks(http: aiohttp.ClientSession, url: str, count: int) -> list[str]:
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def one() -> str:
        async with gate:
            params = {"name": "long_job", "arguments": {"steps": 1}}
            created = await rpc(http, url, "tools/call", params, "long_job")
        if created.get("resultType") != "task" or created.get("status") != "working":
            raise BenchError(f"long_job did not create a task through taskgate: {created}")
        task_id: str = created["taskId"]
        return task_id

    return list(await asyncio.gather(*(one() for _ in range(count))))


async def tool(
    http: aiohttp.ClientSession, backend_url: str, name: str, **arguments: Any
) -> dict[str, Any]:
    """A tool of the backend, called directly; its structuredContent."""
    result = await rpc(
        http, backend_url, "tools/call", {"name": name, "arguments": arguments}, name
    )
    if result.get("isError") is not False or not isinstance(result.get("structuredContent"), dict):
        raise BenchError(f"{name} on the backend answered {result}")
    found: dict[str, Any] = result["structuredContent"]
    return found


def summary(samples_ms: list[float]) -> dict[str, Any]:
    return {
        "samples": len(samples_ms),
        "p50_ms": round(percentile(samples_ms, 0.50), 2),
        "p99_ms": round(percentile(samples_ms, 0.99), 2),
        "min_ms": round(min(samples_ms), 2),
        "max_ms": round(max(samples_ms), 2),
    }


async def measure(
    http: aiohttp.ClientSession,
    backend_url: str,
    task_ids: list[str],
    tally: Tally,
    samples: int,
    spacing_s: float,
) -> dict[str, Any]:
    """`samples` advances, one after another, each timed to its event and to its answer."""
    delays: list[float] = []
    trips: list[float] = []
    event_first = 0
    mismatched = 0
    for index in range(samples):
        task_id = task_ids[index % len(task_ids)]
        status = "input_required" if (index // len(task_ids)) % 2 == 0 else "working"
        arrived = tally.expect(task_id, status)  # before the call: the event may come first
        body = rpc_body(
            "tools/call",
            {"name": "advance", "arguments": {"task_id": task_id, "status": status}},
            index + 1,
        )
        headers = rpc_headers("tools/call", "advance")
        timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
        sent_ns = time.monotonic_ns()
        async with http.post(backend_url, data=body, headers=headers, timeout=timeout) as answer:
            raw = await answer.read()
        answered_ns = time.monotonic_ns()
        event_first += arrived.done()
        result = orjson.loads(raw).get("result") or {}
        moved = result.get("structuredContent")
        if answer.status != 200 or result.get("isError") is not False or not moved:
            raise BenchError(f"advance answered {answer.status}: {raw[:400]!r}")
        async with asyncio.timeout(EVENT_TIMEOUT_S):
            at_ns, event = await arrived
        mismatched += event != moved
        delays.append((at_ns - sent_ns) / 1e6)
        trips.append((answered_ns - sent_ns) / 1e6)
        await asyncio.sleep(spacing_s)
    differences = [d - t for d, t in zip(delays, trips, strict=True)]
    return {
        "delay": summary(delays),
        "round_trip": summary(trips),
        "difference": summary(differences),
        "event_before_answer": event_first,
        "events_not_equal_to_advance": mismatched,
    }


# --- what is measured ---------------------------------------------------------------------


async def scenario(args: argparse.Namespace, taskgate_url: str, backend_url: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    tally = Tally()
    watchers: list[Watcher] = []
    calls = aiohttp.TCPConnector(limit=CREATE_CONCURRENCY)
    # The advance calls: a new connection each unless --advance-keepalive (see the docstring).
    changes = aiohttp.TCPConnector(limit=1, force_close=not args.advance_keepalive)
    held = aiohttp.TCPConnector(limit=0)  # one connection per listen stream, held open
    # A stream lasts the whole run: no total deadline on it; the phases' own timeouts and the
    # run's time limit bound what waits on it.
    forever = aiohttp.ClientTimeout(total=None, sock_connect=CALL_TIMEOUT_S)
    async with (
        aiohttp.ClientSession(connector=calls) as http,
        aiohttp.ClientSession(connector=held, timeout=forever) as streams,
        aiohttp.ClientSession(connector=changes) as advances,
    ):
        try:
            gets = {"at_start": (await tool(http, backend_url, "jobs_stats"))["gets"]}
            if args.idle_streams:
                began = time.monotonic()
                plan: list[list[str]] = [[] for _ in range(args.idle_streams)]
                async with asyncio.timeout(60 + args.idle_streams * 0.05):
                    watchers += await open_streams(
                        streams, taskgate_url, plan, tally, IDLE_FIRST_ID
                    )
                results["idle_open_s"] = round(time.monotonic() - began, 2)
                say(f"opened {args.idle_streams} idle streams in {results['idle_open_s']} s")

            began = time.monotonic()
            async with asyncio.timeout(60 + args.tasks * 0.05):
                task_ids = await create_tasks(http, taskgate_url, args.tasks)
            results["create_s"] = round(time.monotonic() - began, 2)
            say(f"created {args.tasks} tasks through taskgate in {results['create_s']} s")
            gets["tasks_created"] = (await tool(http, backend_url, "jobs_stats"))["gets"]

            plan = [task_ids[j :: args.streams] for j in range(args.streams)]
            began = time.monotonic()
            async with asyncio.timeout(60 + args.tasks * 0.05 + args.streams * 0.05):
                watchers += await open_streams(streams, taskgate_url, plan, tally, 1)
            results["open_s"] = round(time.monotonic() - began, 2)
            say(
                f"opened {args.streams} listen streams over the {args.tasks} tasks in "
                f"{results['open_s']} s, each past its acknowledgement and one snapshot per task"
            )
            opened = await tool(http, backend_url, "jobs_stats")
            gets["streams_open"] = opened["gets"]
            results["backend_when_open"] = opened
            results["backend_listen_streams"] = (await tool(http, backend_url, "listeners"))[
                "streams"
            ]
            notifications_before = tally.notifications

            began = time.monotonic()
            bound = 60 + args.samples * (args.spacing_ms / 1000 + 0.5)
            async with asyncio.timeout(bound):
                measured = await measure(
                    advances, backend_url, task_ids, tally, args.samples, args.spacing_ms / 1000
                )
            measured["elapsed_s"] = round(time.monotonic() - began, 2)
            results.update(measured)
            await asyncio.sleep(0.5)  # anything late or extra would show here
            gets["after_samples"] = (await tool(http, backend_url, "jobs_stats"))["gets"]
            results["tasks_get_served"] = gets
            results["notifications_during_samples"] = tally.notifications - notifications_before
            results["keepalives_received"] = tally.keepalives
            results["streams_ended_early"] = tally.ended
            results["problems"] = tally.problems[:20]
            say(f"{args.samples} samples in {measured['elapsed_s']} s")
            if tally.ended or tally.problems:
                raise BenchError(
                    f"streams ended early: {tally.ended}; problems: {tally.problems[:5]}"
                )
            if measured["events_not_equal_to_advance"]:
                raise BenchError(
                    f"{measured['events_not_equal_to_advance']} events differ from the task "
                    "advance answered"
                )
        finally:
            for watcher in watchers:
                watcher.close()
    return results


# --- the run ------------------------------------------------------------------------------


def taskgate_config(
    args: argparse.Namespace, work: Path, port: int, backend: str
) -> dict[str, Any]:
    streams = args.streams + args.idle_streams + CAPACITY_SLACK
    per_stream = -(-args.tasks // args.streams)
    return {
        "listen": {"host": "127.0.0.1", "port": port, "max_connections": streams + 1024},
        "store": {"url": f"sqlite:///{work}/routes.db", "cache_size": max(10_000, 2 * streams)},
        "auth": {"mode": "none"},
        "backends": {"jobs": {"replicas": [backend]}},
        "routes": [{"tools": ["*"], "backend": "jobs"}],
        "subscriptions": {
            "max_streams": streams,
            "max_streams_per_principal": streams,
            "max_task_ids": max(100, per_stream),
            "max_pollers": args.tasks + CAPACITY_SLACK,
            "keepalive_s": KEEPALIVE_S,
        },
    }


@contextlib.contextmanager
def started(args: argparse.Namespace, work: Path) -> Iterator[dict[str, Any]]:
    (port,) = free_ports(1)
    backend = PushingBackendProcess("p1")
    try:
        backend.start()
        with contextlib.ExitStack() as stack:
            settings = taskgate_config(args, work, port, backend.url)
            config = work / "taskgate.yaml"
            config.write_text(json.dumps(settings, indent=2) + "\n")  # JSON is YAML
            taskgate = stack.enter_context(procs.taskgate(config, port))
            yield {
                "taskgate_url": f"http://127.0.0.1:{port}/mcp",
                "backend_url": backend.url,
                "pids": {"backend": backend.pid, "taskgate": taskgate.pid},
                "commands": {"backend": backend.argv, "taskgate": load.argv_of(taskgate)},
                "taskgate_config": settings,
            }
    except RuntimeError:
        sys.stderr.write(f"backend stderr:\n{backend.log_text()[-4000:]}\n")
        raise
    finally:
        backend.cleanup()  # SIGTERM by pid, SIGKILL after 10 s; removes its log


def _stop(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(
        f"bench.listen_push: {signal.Signals(signum).name}; stopping everything it started"
    )


def line(label: str, found: dict[str, Any]) -> str:
    return (
        f"{label}: p50 {found['p50_ms']:.2f} ms, p99 {found['p99_ms']:.2f} ms "
        f"(min {found['min_ms']:.2f}, max {found['max_ms']:.2f}; {found['samples']} samples)"
    )


def report(args: argparse.Namespace, document: dict[str, Any]) -> None:
    m, r, run = document["machine"], document["results"], document["setup"]
    sub = run["taskgate_config"]["subscriptions"]
    gets = r["tasks_get_served"]
    print()
    print(
        "bench.listen_push: backend change -> client event, pushed over taskgate's upstream listen"
    )
    print(
        f"machine: {m['nproc']} CPUs (os.cpu_count()), {m['cpu_model']}, {m['platform']}; "
        f"load average at start {', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}"
    )
    print(
        f"versions: Python {m['python']}, aiohttp {m['aiohttp']}, uvloop {m['uvloop']}, "
        f"mcp {m['mcp']}, uvicorn {m['uvicorn']}, taskgate {m['taskgate']} (commit "
        f"{m['source']['commit'][:12]}, {len(m['source']['gateway_changes_not_committed'])} "
        "files in gateway/ not committed)"
    )
    fd = document["fd_limit"]
    print(
        f"file descriptors: RLIMIT_NOFILE soft {fd['soft_before']} -> {fd['soft']} "
        f"(hard {fd['hard']}), inherited by both processes"
    )
    for name, argv in run["commands"].items():
        print(f"{name} (pid {run['pids'][name]}): {' '.join(argv)}")
    print(
        f"parameters: --tasks {args.tasks} --samples {args.samples} --streams {args.streams} "
        f"--idle-streams {args.idle_streams} --spacing-ms {args.spacing_ms:g}"
        f"{' --advance-keepalive' if args.advance_keepalive else ''}; taskgate: auth "
        f"none, SQLite store, backend jobs (1 replica), route * ; subscriptions "
        f"{json.dumps(sub, separators=(',', ':'))}"
    )
    idle = (
        f"{args.idle_streams} idle streams (toolsListChanged) opened first in "
        f"{r['idle_open_s']} s; "
        if args.idle_streams
        else "no idle streams; "
    )
    print(
        f"setup: {idle}{args.tasks} tasks created through taskgate in {r['create_s']} s "
        f"({CREATE_CONCURRENCY} at once); {args.streams} listen stream(s) over them opened in "
        f"{r['open_s']} s, each past its acknowledgement and a first snapshot of every task"
    )
    opened = r["backend_when_open"]
    print(
        f"pushed, not polled: the backend was sent tasks/get {gets['at_start']} times at start, "
        f"{gets['tasks_created']} once the tasks were created, {gets['streams_open']} once the "
        f"listens were open (+{gets['streams_open'] - gets['tasks_created']}: taskgate's one "
        f"snapshot per task at open), {gets['after_samples']} after the samples "
        f"(+{gets['after_samples'] - gets['streams_open']} during them); the replica held "
        f"{r['backend_listen_streams']} listen stream(s), {opened['task_streams']} watching tasks"
    )
    moves = "input_required" if args.samples <= args.tasks else "input_required|working"
    connection = "one kept-alive connection" if args.advance_keepalive else "a new connection each"
    print(
        f"samples: {args.samples}, one after another, {args.spacing_ms:g} ms from one's event "
        f"and answer to the next call; each `advance(task, {moves})` sent to the backend "
        f"directly, on {connection}; "
        f"{r['notifications_during_samples']} notifications/tasks arrived, each equal to the task "
        f"advance answered; the event came before advance's answer in "
        f"{r['event_before_answer']} of {args.samples}; in {r['elapsed_s']} s; the streams got "
        f"{r['keepalives_received']} keep-alive comments in the whole run (keepalive_s "
        f"{sub['keepalive_s']:g})"
    )
    print(line("delay, call sent -> notifications/tasks read by the client", r["delay"]))
    print(line("advance round trip, call sent -> its answer read", r["round_trip"]))
    print(line("difference per sample, delay - round trip", r["difference"]))
    print(
        "  every time is CLOCK_MONOTONIC in this one client process; both include this process's "
        "own event loop (one loop reads the stream and the answer)"
    )
    print(f"elapsed {document['elapsed_s']} s; stopped every process it started")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--streams", type=int, default=1, help="listens splitting the task ids")
    parser.add_argument("--idle-streams", type=int, default=0, help="toolsListChanged only")
    parser.add_argument("--spacing-ms", type=float, default=20.0, help="between two samples")
    parser.add_argument(
        "--advance-keepalive",
        action="store_true",
        help="send every advance on one kept-alive connection (not a new one each)",
    )
    parser.add_argument("--json", type=Path, help="write every result here")
    args = parser.parse_args()
    if min(args.tasks, args.samples, args.streams) < 1 or args.idle_streams < 0:
        raise SystemExit("--tasks, --samples and --streams must be at least 1, --idle-streams 0+")
    if args.streams > args.tasks:
        raise SystemExit("--streams must not exceed --tasks (each watches at least one task)")
    if -(-args.tasks // args.streams) > 10_000:
        raise SystemExit("at most 10,000 task ids per stream (subscriptions.max_task_ids)")
    import gateway

    fd_limit = raise_fd_limit()
    needed = args.streams + args.idle_streams + 1024
    if fd_limit["soft"] < needed:
        raise SystemExit(f"RLIMIT_NOFILE {fd_limit['soft']} is below the {needed} fds needed")
    machine = load.machine()
    machine.pop("wrk", None)
    machine.update(
        uvloop=metadata.version("uvloop"),
        mcp=metadata.version("mcp"),
        uvicorn=metadata.version("uvicorn"),
        taskgate=gateway.__version__,
        source=load.source("gateway", "backends", "bench"),
    )
    # The whole run's time limit; SIGALRM and SIGTERM stop everything it started.
    limit = 300 + 0.1 * (args.tasks + args.streams + args.idle_streams)
    limit += args.samples * (args.spacing_ms / 1000 + 0.5)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGALRM, _stop)
    signal.alarm(int(limit))
    began = time.monotonic()
    print(
        f"bench.listen_push: {args.samples} pushed changes over {args.tasks} tasks, "
        f"{args.streams} stream(s), {args.idle_streams} idle streams",
        flush=True,
    )
    with (
        tempfile.TemporaryDirectory(prefix="taskgate-listen-push-") as work,
        started(args, Path(work)) as setup,
    ):
        say(f"taskgate pid {setup['pids']['taskgate']}, backend pid {setup['pids']['backend']}")
        results = asyncio.run(scenario(args, setup["taskgate_url"], setup["backend_url"]))
    signal.alarm(0)
    document: dict[str, Any] = {
        "method": __doc__,
        "machine": machine,
        "fd_limit": fd_limit,
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
