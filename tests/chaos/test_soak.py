"""Soak: hostile clients and a hostile replica beside well-behaved clients, for 25 s.

One `taskgate run` process (a subprocess, so that its RSS can be read from /proc) stands in
front of a fast real MCP backend (bench/instant_backend.py) and of a replica that misbehaves
(tests/support/hostile.py). Through the attack:

- clients that break the rules: pipelined requests never read (GET / and valid POSTs), POSTs
  read slowly, more slow bodies than listen.max_in_flight, slowloris heads, bodies over
  listen.max_body_bytes (by Content-Length and chunked), a header line without end, and many
  connections asking for answers of 1 MiB that they never read (past the answer budget);
- callers of the hostile replica's tools: a head whose header lines never end, a header line
  that never ends, a body trickled forever, a body without framing flooded, an event stream
  flooded (read slowly);
- well-behaved clients (aiohttp, one pool) calling tools/call, creating tasks and polling them.

Then: every well-behaved request got 200 and a JSON-RPC result, none took longer than a coarse
sanity bound, and taskgate's RSS, sampled throughout, stayed under the worst case that
docs/operations.md ("Memory bounds") documents for the test's configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from gateway.config import Config, parse_config
from tests.support.chaos import TaskgateProcess
from tests.support.hostile import (
    CROSSING_READ,
    KIB,
    MAX_ROUNDS,
    MIB,
    MIN_ROUND_S,
    MISBEHAVIOURS,
    Attack,
    Child,
    Round,
    Tally,
    Window,
    answer_budget_bound,
    endless_header_line,
    mb,
    memory_bound,
    never_read,
    oversized_chunked,
    oversized_length,
    per_connection_bound,
    post_flood_slow,
    post_flood_unread,
    python_module,
    replica_stats,
    rss_bytes,
    run_attacker,
    slow_body,
    slowloris,
)
from tests.support.mcp import build_request, mcp_headers, post_raw
from tests.support.procs import LOOPBACK, RedisProcess, free_ports

ATTACK_S = 25.0
GOOD_WORKERS = 8
WARMUP = 15  # requests per well-behaved worker before the baseline
# Every TASK_EVERY-th well-behaved request creates a task, and the next one polls it.
TASK_EVERY = 5
# A coarse sanity bound on one well-behaved request; timing claims belong in bench/.
LATENCY_BOUND_S = 2.0
GOOD_TIMEOUT = aiohttp.ClientTimeout(total=10)
# Callers of each misbehaving tool at once (12 in all: the hostile backend's max_in_flight).
# flood_body gets more: every answer taskgate abandons past max_answer_bytes must be freed
# with its request, and a few callers make enough of them to show it if not.
HOSTILE_CALLERS = {tool: 4 if tool == "flood_body" else 2 for tool in MISBEHAVIOURS}
# A slow reader of a flooding event stream leaves after this long (and calls again): the
# bytes taskgate already wrote sit in the kernel's socket buffers, which drain slowly.
STREAM_READ_S = 5.0
SAMPLE_EVERY_S = 0.1
# Past this the attack stops at once: the test has failed, and the machine is shared.
CEILING_OVER_BOUND = 1024 * MIB
# Connections that ask for large answers and never read them: unbounded, taskgate would hold
# an answer of 1 MiB for many of them, several times what its answer budget allows.
LARGE_UNREAD = 144
# Each sends a request this often (the large answers' backend takes 4 at once; the others get
# the retryable 503 at once), until taskgate stops reading it.
LARGE_EVERY_S = 0.25
LARGE_CALLS = 100


def soak_config(port: int, store_url: str, good: str, hostile: str) -> dict[str, Any]:
    """Small limits, so that the documented bound is tight enough to mean something.

    Slots: the well-behaved workers (8), the hostile backend's max_in_flight (12), the
    pipelined POST floods (one request at a time on each of 4 connections) and the large
    answers' backend (4: an answer waiting for the budget holds its slot until its deadline)
    need 28 of the 32; only slow senders holding slots could make a well-behaved request meet
    the limit, which is why every well-behaved request must get 200, never the retryable 503.
    """
    return {
        "listen": {
            "host": LOOPBACK,
            "port": port,
            "max_connections": 256,
            "max_in_flight": 32,
            "max_body_bytes": 64 * KIB,
            "max_buffered_bytes": 8 * MIB,
            "max_answer_buffer_bytes": 4 * MIB,
            "read_timeout_s": 2,
            "keepalive_timeout_s": 30,
            "max_header_bytes": 8190,
            "max_headers": 32,
            "max_head_bytes": 16 * KIB,
            "drain_timeout_s": 2,
        },
        "store": {"url": store_url, "timeout_s": 2},
        "auth": {"mode": "none"},
        # The hostile replica answers its probes and fails its calls: left in rotation, it
        # keeps being called, which is the worst case for taskgate's memory.
        "health": {"unhealthy_after": 1_000_000},
        "backends": {
            "good": {
                "replicas": [good],
                "timeout_s": 5,
                "task_timeout_s": 5,
                "max_answer_bytes": MIB,
            },
            "hostile": {
                "replicas": [hostile],
                "timeout_s": 3,
                "task_timeout_s": 3,
                "max_in_flight": 12,
                "max_answer_bytes": MIB,
            },
            # The same replica's one well-formed large answer, for clients that never read.
            "large": {
                "replicas": [hostile],
                "timeout_s": 3,
                "max_in_flight": 4,
                "max_answer_bytes": MIB,
            },
        },
        "routes": [
            {"tools": ["echo", "make_task"], "backend": "good"},
            {"tools": ["ping", *MISBEHAVIOURS], "backend": "hostile"},
            {"tools": ["large_answer"], "backend": "large"},
        ],
    }


def attackers(config: Config) -> list[tuple[str, Attack, int]]:
    """(kind, attack, connections at once) of every misbehaving client."""
    return [
        ("never read: pipelined GET /", never_read, 4),
        ("never read: pipelined POSTs", post_flood_unread, 2),
        ("read slowly: pipelined POSTs", post_flood_slow, 2),
        ("slow body: 85 of 170 bytes", slow_body, config.listen.max_in_flight + 8),
        ("slowloris", slowloris, 8),
        ("Content-Length over max_body_bytes", oversized_length, 3),
        ("chunked body over max_body_bytes", oversized_chunked, 3),
        ("endless header line", endless_header_line, 3),
        ("never read: large answers", large_unread, LARGE_UNREAD),
    ]


LARGE_BODY = orjson.dumps(build_request("tools/call", {"name": "large_answer"}, id=1))
LARGE_CALL = (
    b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    + b"".join(
        b"%s: %s\r\n" % (k.encode(), v.encode())
        for k, v in mcp_headers("tools/call", {"name": "large_answer"}).items()
    )
    + b"Content-Length: %d\r\n\r\n%s" % (len(LARGE_BODY), LARGE_BODY)
)


async def large_unread(port: int, state: Round) -> str:
    """tools/call large_answer (a result of 1000 KiB) again and again, never read, from a
    socket with a small receive buffer (so that taskgate's answers stay in taskgate, not in
    the kernel), held open until the attack's window closes."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * KIB)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, (LOOPBACK, port))
        for _ in range(LARGE_CALLS):
            state.stalled = True  # waits once taskgate stops reading this connection
            await loop.sock_sendall(sock, LARGE_CALL)
            state.stalled = False
            state.sent += len(LARGE_CALL)
            await asyncio.sleep(LARGE_EVERY_S)  # pacing, not synchronisation
        await asyncio.Event().wait()  # never read; the window's end cancels this
    finally:
        sock.close()
    return "closed"


# -- well-behaved clients -----------------------------------------------------------------------


@dataclass
class Served:
    method: str
    latency: float
    problem: str | None = None


@dataclass
class Ledger:
    served: list[Served] = field(default_factory=list)

    @property
    def problems(self) -> list[Served]:
        return [s for s in self.served if s.problem is not None]

    @property
    def slow(self) -> list[Served]:
        return [s for s in self.served if s.latency >= LATENCY_BOUND_S]

    def by_method(self) -> dict[str, int]:
        return dict(Counter(s.method for s in self.served if s.problem is None))


async def good_call(
    http: aiohttp.ClientSession,
    url: str,
    ledger: Ledger,
    method: str,
    params: Mapping[str, Any],
    request_id: int,
) -> dict[str, Any] | None:
    """One well-behaved request; its result when it got 200 and a JSON-RPC result."""
    label = f"{method} {params.get('name', '')}".strip()
    began = time.monotonic()
    problem = None
    result = None
    try:
        answer = await post_raw(http, url, build_request(method, params, id=request_id))
    except (aiohttp.ClientError, TimeoutError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    else:
        try:
            message = answer.message
        except orjson.JSONDecodeError:
            message = {}
        found = message.get("result") if message.get("id") == request_id else None
        if answer.status != 200 or not isinstance(found, dict):
            problem = f"HTTP {answer.status}: {answer.raw[:200]!r}"
        else:
            result = found
    ledger.served.append(Served(label, time.monotonic() - began, problem))
    return result


async def good_worker(
    http: aiohttp.ClientSession,
    url: str,
    ledger: Ledger,
    ids: Iterator[int],
    keep_going: Callable[[], bool],
    limit: int,
) -> None:
    """tools/call echo; every TASK_EVERY-th time make_task, then tasks/get of that task."""
    for n in range(limit):
        if not keep_going():
            return
        if n % TASK_EVERY:
            params = {"name": "echo", "arguments": {"text": "hello"}}
            await good_call(http, url, ledger, "tools/call", params, next(ids))
            continue
        params = {"name": "make_task", "arguments": {}}
        created = await good_call(http, url, ledger, "tools/call", params, next(ids))
        if created is None:
            continue
        task_id = created.get("taskId")
        if created.get("resultType") != "task" or not isinstance(task_id, str):
            ledger.served[-1].problem = f"not a task: {created!r}"
            continue
        got = await good_call(http, url, ledger, "tasks/get", {"taskId": task_id}, next(ids))
        if got is not None and got.get("taskId") != task_id:
            ledger.served[-1].problem = f"another task: {got!r}"


# -- callers of the hostile replica -------------------------------------------------------------


async def hostile_call(http: aiohttp.ClientSession, url: str, tool: str, request_id: int) -> str:
    """Call a misbehaving tool; read the answer (an event stream 4 KiB every 50 ms)."""
    body = build_request("tools/call", {"name": tool, "arguments": {}}, id=request_id)
    headers = mcp_headers("tools/call", body["params"])
    async with http.post(url, data=orjson.dumps(body), headers=headers) as response:
        streamed = response.content_type == "text/event-stream"
        raw = b""
        try:
            async with asyncio.timeout(STREAM_READ_S if streamed else None):
                while chunk := await response.content.read(4 * KIB):
                    if streamed:
                        await asyncio.sleep(0.05)  # pacing: a slow reader of the stream
                    else:
                        raw += chunk
        except aiohttp.ClientPayloadError:
            return f"{response.status} then cut"
        except TimeoutError:
            return f"{response.status} stream, left after {STREAM_READ_S:g} s"
        if streamed:
            return f"{response.status} stream ended"
        with contextlib.suppress(orjson.JSONDecodeError, KeyError, TypeError):
            return f"{response.status} ({orjson.loads(raw)['error']['code']})"
        return f"{response.status}"


async def hostile_caller(
    http: aiohttp.ClientSession,
    url: str,
    tool: str,
    window: Window,
    tally: Tally,
    ids: Iterator[int],
) -> None:
    kind = f"calls {tool}"
    loop = asyncio.get_running_loop()
    for _ in range(MAX_ROUNDS):
        if not window.open:
            return
        began = loop.time()
        try:
            async with window.bounded():
                how = await hostile_call(http, url, tool, next(ids))
        except TimeoutError:
            how = "open at the end"
        except (aiohttp.ClientError, KeyError, TypeError) as exc:
            how = type(exc).__name__
        tally.ended[kind][how] += 1
        pause = began + MIN_ROUND_S - loop.time()
        if pause > 0 and window.open:
            await asyncio.sleep(pause)  # pacing, not synchronisation


# -- taskgate's RSS -----------------------------------------------------------------------------


@dataclass
class Rss:
    pid: int
    samples: int = 0
    peak: int = 0
    peak_at: float = 0.0
    gone: str | None = None

    async def follow(self, stop: asyncio.Event, window: Window, ceiling: int) -> None:
        """Sample until `stop`; close the attack window if RSS passes `ceiling`."""
        began = time.monotonic()
        while not stop.is_set():
            try:
                rss = rss_bytes(self.pid)
            except OSError as exc:
                self.gone = str(exc)
                window.close("taskgate's process is gone")
                return
            self.samples += 1
            if rss > self.peak:
                self.peak, self.peak_at = rss, time.monotonic() - began
            if rss > ceiling:
                window.close(f"RSS {mb(rss)} passed the safety ceiling {mb(ceiling)}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SAMPLE_EVERY_S)


# -- the test -----------------------------------------------------------------------------------


def launch_attack(
    config: Config,
    port: int,
    window: Window,
    tally: Tally,
    ledger: Ledger,
    ids: Iterator[int],
    good: aiohttp.ClientSession,
    rude: aiohttp.ClientSession,
) -> list[asyncio.Task[None]]:
    """Every attacker, every caller of the hostile replica and every well-behaved client, all
    running until the window closes."""
    url = f"http://{LOOPBACK}:{port}/mcp"
    tasks = [
        asyncio.create_task(run_attacker(kind, attack, port, window, tally))
        for kind, attack, count in attackers(config)
        for _ in range(count)
    ]
    tasks += [
        asyncio.create_task(hostile_caller(rude, url, tool, window, tally, ids))
        for tool, count in HOSTILE_CALLERS.items()
        for _ in range(count)
    ]
    tasks += [
        asyncio.create_task(good_worker(good, url, ledger, ids, lambda: window.open, 1_000_000))
        for _ in range(GOOD_WORKERS)
    ]
    return tasks


def figures(
    config: Config,
    baseline: int,
    bound: int,
    rss: Rss,
    window: Window,
    attack_s: float,
    ledger: Ledger,
    tally: Tally,
    calls: dict[str, int],
) -> dict[str, object]:
    listen = config.listen
    return {
        "baseline_rss": mb(baseline),
        "peak_rss": mb(rss.peak),
        "peak_at_s": f"{rss.peak_at:.1f}",
        "bound": mb(bound),
        "bound_terms": (
            f"baseline + {listen.max_connections} x {mb(per_connection_bound(config))} + "
            f"{mb(listen.max_buffered_bytes)} + {mb(answer_budget_bound(config))} + "
            f"{listen.max_in_flight} x {mb(CROSSING_READ + listen.max_head_bytes)}"
        ),
        "rss_samples": rss.samples,
        "attack_s": f"{attack_s:.1f}",
        "attack_closed_early": window.closed_early or "no",
        "good_served": len(ledger.served) - len(ledger.problems),
        "good_by_method": ledger.by_method(),
        "good_failures": len(ledger.problems),
        "good_max_latency_s": f"{max((s.latency for s in ledger.served), default=0):.3f}",
        "hostile_replica_calls": calls,
        **{f"attacker {kind}": how for kind, how in tally.summary().items()},
    }


@pytest.mark.timeout(180)
async def test_hostile_clients_and_replica_neither_starve_good_clients_nor_grow_memory(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    taskgate_port, good_port, hostile_port = free_ports(3)
    redis = RedisProcess()
    instant = python_module("bench.instant_backend", "--port", str(good_port))
    good = Child("instant", instant, good_port, tmp_path)
    rogue = python_module("tests.support.hostile", "--port", str(hostile_port))
    hostile = Child("hostile", rogue, hostile_port, tmp_path)
    taskgate: TaskgateProcess | None = None
    window: Window | None = None
    spawned: list[asyncio.Task[None]] = []
    try:
        redis.start()
        good.launch()
        hostile.launch()
        await good.wait_ready()
        await hostile.wait_ready()
        text = yaml.safe_dump(soak_config(taskgate_port, redis.url, good.url, hostile.url))
        config = parse_config(text)
        path = tmp_path / "taskgate.yaml"
        path.write_text(text)
        taskgate = TaskgateProcess("soak", path, taskgate_port)
        await taskgate.start()
        ids = itertools.count(1)
        good_pool = aiohttp.TCPConnector(limit=GOOD_WORKERS)
        rude_pool = aiohttp.TCPConnector(limit=sum(HOSTILE_CALLERS.values()))
        async with (
            aiohttp.ClientSession(connector=good_pool, timeout=GOOD_TIMEOUT) as http,
            aiohttp.ClientSession(connector=rude_pool) as rude,
        ):
            # Warm-up: both routes work, discovery is done, the pool's connections are open.
            warmup = Ledger()
            async with asyncio.timeout(60), asyncio.TaskGroup() as group:
                for _ in range(GOOD_WORKERS):
                    group.create_task(
                        good_worker(http, taskgate.url, warmup, ids, lambda: True, WARMUP)
                    )
                ping = good_call(http, taskgate.url, warmup, "tools/call", {"name": "ping"}, 0)
                group.create_task(ping)
            assert not warmup.problems, warmup.problems[:5]
            baseline = rss_bytes(taskgate.pid)
            bound = memory_bound(config, baseline_rss=baseline)

            window = Window(ATTACK_S)
            tally = Tally()
            ledger = Ledger()
            rss = Rss(taskgate.pid)
            stop_sampling = asyncio.Event()
            sampler = asyncio.create_task(
                rss.follow(stop_sampling, window, bound + CEILING_OVER_BOUND)
            )
            spawned.append(sampler)
            started = time.monotonic()
            attack = launch_attack(config, taskgate_port, window, tally, ledger, ids, http, rude)
            spawned += attack
            async with asyncio.timeout(ATTACK_S + 30):
                await asyncio.gather(*attack)
            attack_s = time.monotonic() - started
            stop_sampling.set()
            await sampler
            alive = taskgate.running()
            calls = await replica_stats(hostile.url)

        found = figures(config, baseline, bound, rss, window, attack_s, ledger, tally, calls)
        for key, value in found.items():
            record_property(key, value)
        print("\nsoak:\n" + "\n".join(f"  {key}: {value}" for key, value in found.items()))
        failures = Counter(s.problem[:100] for s in ledger.problems if s.problem)
        if failures:
            print("  good failures: " + "; ".join(f"{p} x{n}" for p, n in failures.items()))

        assert alive, f"taskgate died during the attack: {taskgate.log_text()[-3000:]}"
        assert rss.peak <= bound, f"taskgate's RSS reached {mb(rss.peak)}, over {mb(bound)}"
        assert not ledger.problems, f"{len(ledger.problems)} well-behaved requests failed: " + (
            "; ".join(f"{p} x{n}" for p, n in failures.most_common(5))
        )
        assert not ledger.slow, (
            f"{len(ledger.slow)} well-behaved requests took {LATENCY_BOUND_S} s or more"
        )
        assert window.closed_early is None, window.closed_early
        # The attack happened: every attacker ran, every misbehaviour reached the replica.
        assert len(ledger.served) >= GOOD_WORKERS, ledger.by_method()
        for kind, _, _ in attackers(config):
            assert tally.ended[kind].total() > 0, f"{kind} never ran"
        for tool in (*MISBEHAVIOURS, "large_answer"):
            assert calls.get(tool, 0) > 0, f"the hostile replica never got to {tool}: {calls}"
    finally:
        if window is not None:
            window.close("the test ended")
        for task in spawned:
            task.cancel()
        await asyncio.gather(*spawned, return_exceptions=True)
        if taskgate is not None:
            taskgate.stop()
        good.stop()
        hostile.stop()
        redis.cleanup()
