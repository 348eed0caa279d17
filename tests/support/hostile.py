"""Hostile parts for the soak test: the memory bound taskgate documents, its RSS, a replica that
misbehaves (`python -m tests.support.hostile --port N`), and clients that break the rules.

Every attacker here is bounded: in time by the attack's `Window`, in count by a round limit, in
bytes by a cap per round; every socket it opens is aborted when its round ends, however it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gateway.config import Config
from tests.support.mcp import build_request, mcp_headers
from tests.support.procs import LOOPBACK, REPO_ROOT

KIB = 1024
MIB = 1024 * KIB

# -- the memory bound -------------------------------------------------------------------------

# The objects of one connection: protocol, parser, transport, timers (measured: 3.4 KB idle).
CONNECTION_OBJECTS = 4 * KIB
# The objects of one parsed header field, beyond its bytes.
FIELD_OBJECTS = 100
# The write buffer's high-water mark (taskgate's own answers, which the answer budget does not
# count, may go over it: a refusal or a small JSON-RPC answer here).
WRITE_HIGH_WATER = 64 * KIB
# A relayed event stream: what is read from the replica before reading pauses (256 KiB, plus
# one read) and the one event inspected for a task (4 MiB).
STREAM = 512 * KIB + 4 * MIB
# Per request in flight, what the answer budget lets pass its line: the read that crossed it
# (at most the upstream read-ahead, 256 KiB, and one read, 256 KiB).
CROSSING_READ = 512 * KIB


def answer_bound(config: Config) -> int:
    """A: the largest answer taskgate reads whole from a replica, the max over backends."""
    return max(backend.max_answer_bytes for backend in config.backends.values())


def per_connection_bound(config: Config) -> int:
    """What one client connection may make taskgate hold outside the answer budget: 4 KiB +
    2 x (H + 100 x F) + 64 KiB, with H = listen.max_head_bytes and F = listen.max_headers: the
    connection, two parsed heads (the one answered, the one read ahead), the write buffer."""
    listen = config.listen
    head = listen.max_head_bytes + FIELD_OBJECTS * listen.max_headers
    return CONNECTION_OBJECTS + 2 * head + WRITE_HIGH_WATER


def answer_budget_bound(config: Config) -> int:
    """What the answer budget lets every answer held for clients take together (relayed answers
    read, events decoded, bytes unsent): 2 x listen.max_answer_buffer_bytes + max(A, S), the
    reserves, the excess read under the limit and the one account beyond it; plus A, one answer
    copied at a time (joined when read whole, cut in pieces when written)."""
    answer = answer_bound(config)
    return 2 * config.listen.max_answer_buffer_bytes + max(answer, STREAM) + answer


def memory_bound(config: Config, *, baseline_rss: int) -> int:
    """taskgate's worst-case RSS under `config`, in bytes: the formula of docs/operations.md,
    "Memory bounds":

        baseline_rss
        + listen.max_connections * per_connection_bound(config)
        + listen.max_buffered_bytes                   (request bodies, pipelined bytes)
        + answer_budget_bound(config)                 (answers held for clients)
        + listen.max_in_flight * (512 KiB + H)        (the read that crossed the budget's line,
                                                       and a replica's head)

    `baseline_rss` is taskgate's RSS after start and a warm-up of well-behaved requests.
    """
    listen = config.listen
    return (
        baseline_rss
        + listen.max_connections * per_connection_bound(config)
        + listen.max_buffered_bytes
        + answer_budget_bound(config)
        + listen.max_in_flight * (CROSSING_READ + listen.max_head_bytes)
    )


def rss_bytes(pid: int) -> int:
    """VmRSS of a live process, from /proc/<pid>/status; OSError once it is gone."""
    with open(f"/proc/{pid}/status", "rb") as status:
        for line in status:
            if line.startswith(b"VmRSS:"):
                return int(line.split()[1]) * KIB
    raise OSError(f"no VmRSS for pid {pid} (a zombie?)")


def mb(size: int) -> str:
    return f"{size / MIB:,.1f} MiB"


# -- child processes, stopped by pid ------------------------------------------------------------

READY_WITHIN_S = 30.0
STOP_WITHIN_S = 10.0
POLL_S = 0.05


class Child:
    """A helper server on a loopback port: started, found ready when the port accepts, and
    stopped by pid (SIGTERM, SIGKILL after a grace period). Its output goes to a log file."""

    def __init__(self, name: str, argv: list[str], port: int, log_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.port = port
        self.log_path = log_dir / f"{name}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/mcp"

    def launch(self) -> None:
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.argv,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    async def wait_ready(self, within: float = READY_WITHIN_S) -> None:
        """Poll the port until it accepts a connection; raise with the log if the child exits."""
        proc = self._proc
        assert proc is not None, f"{self.name} was never launched"
        async with asyncio.timeout(within):
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {proc.returncode}: {self.log()}")
                try:
                    _, writer = await asyncio.open_connection(LOOPBACK, self.port)
                except OSError:
                    await asyncio.sleep(POLL_S)
                    continue
                writer.close()
                await writer.wait_closed()
                return

    def stop(self) -> None:
        """SIGTERM by pid, then SIGKILL; reaps the child. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_WITHIN_S)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        self._proc = None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError as exc:
            return f"<no log: {exc}>"


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


# -- the misbehaving replica --------------------------------------------------------------------

# Tools the replica serves: `ping` answers properly (it proves the route works), `stats` counts
# calls (asked directly, not through taskgate); the others misbehave, each in its own way.
MISBEHAVIOURS = (
    "endless_headers",  # a head whose header lines never end
    "endless_header_line",  # a head with one header line that never ends
    "trickle_body",  # a JSON body of 1 GiB announced, 256 bytes sent every 50 ms
    "flood_body",  # a JSON body without framing, sent as fast as taskgate reads it
    "flood_stream",  # an event stream sent as fast as taskgate relays it
)
# `large_answer` answers properly too, with a result of LARGE_TEXT bytes: for clients that ask
# for it and never read.
TOOLS = ("ping", "large_answer", *MISBEHAVIOURS)
LARGE_TEXT = 1000 * KIB
# The replica's own bound on one misbehaviour, in case nothing else ends it.
MISBEHAVE_FOR_S = 60.0
STAMP_META = {"io.modelcontextprotocol/serverInfo": {"name": "hostile", "version": "1"}}
_PAD = b"x" * 100
_HEADER_BLOCK = b"".join(b"X-Pad-%d: %s\r\n" % (i, _PAD) for i in range(600))
_LINE_BLOCK = b"y" * (64 * KIB)
_BODY_BLOCK = b"z" * (64 * KIB)
_EVENT = b"data: " + orjson.dumps(
    {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "e" * 900}}
)
_EVENT_CHUNK = b"%x\r\n%s\r\n" % (16 * (len(_EVENT) + 2), (_EVENT + b"\n\n") * 16)


class HostileReplica:
    """An MCP replica over raw asyncio streams: discovery and `ping` answered properly, the
    other tools answered in ways no HTTP/1.1 server should."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                message = orjson.loads(await reader.readexactly(length))
                if not await self._answer(message, writer):
                    return
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            return
        except TimeoutError:
            return  # MISBEHAVE_FOR_S passed
        finally:
            writer.transport.abort()

    async def _answer(self, message: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection must end."""
        method = message.get("method")
        params = message.get("params") or {}
        tool = params.get("name") if method == "tools/call" else None
        if tool in MISBEHAVIOURS:
            self.calls[tool] += 1
            async with asyncio.timeout(MISBEHAVE_FOR_S):
                await getattr(self, f"_{tool}")(writer)
            return False
        result: dict[str, Any]
        if method == "server/discover":
            result = {
                "supportedVersions": ["2026-07-28"],
                "capabilities": {"tools": {}},
                "ttlMs": 0,
                "cacheScope": "public",
            }
        elif method == "tools/list":
            result = {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in TOOLS]}
        elif tool == "ping":
            self.calls[tool] += 1
            result = {"content": [{"type": "text", "text": "pong"}]}
        elif tool == "large_answer":
            self.calls[tool] += 1
            result = {"content": [{"type": "text", "text": "l" * LARGE_TEXT}]}
        elif tool == "stats":
            result = {"content": [], "structuredContent": dict(self.calls)}
        else:
            error = {"jsonrpc": "2.0", "id": message.get("id"), "error": {"code": -32601}}
            _write_json(writer, 400, orjson.dumps(error))
            await writer.drain()
            return True
        result.update(resultType="complete", _meta=STAMP_META)
        _write_json(
            writer, 200, orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})
        )
        await writer.drain()
        return True

    async def _endless_headers(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        while True:
            writer.write(_HEADER_BLOCK)
            await writer.drain()

    async def _endless_header_line(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Endless: ")
        while True:
            writer.write(_LINE_BLOCK)
            await writer.drain()

    async def _trickle_body(self, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1073741824\r\n\r\n"
        )
        while True:
            writer.write(b" " * 256)
            await writer.drain()
            await asyncio.sleep(0.05)  # pacing: the trickle is the misbehaviour

    async def _flood_body(self, writer: asyncio.StreamWriter) -> None:
        # No Content-Length, no chunks: the body ends when the connection does, i.e. never.
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
            b'{"jsonrpc": "2.0", "id": 1, "result": {"pad": "'
        )
        while True:
            writer.write(_BODY_BLOCK)
            await writer.drain()

    async def _flood_stream(self, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        while True:
            writer.write(_EVENT_CHUNK)
            await writer.drain()


def _write_json(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
    reason = b"OK" if status == 200 else b"Bad Request"
    writer.write(
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (status, reason, len(body), body)
    )


async def _serve_replica(port: int) -> None:
    replica = HostileReplica()
    server = await asyncio.start_server(replica.serve, LOOPBACK, port, limit=MIB)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        print(f"hostile replica on {LOOPBACK}:{port}", flush=True)
        await stop.wait()
    print(f"hostile replica served {dict(replica.calls)}", flush=True)


async def replica_stats(url: str) -> dict[str, int]:
    """How often the replica at `url` was called, per tool (asked directly, not via taskgate)."""
    body = orjson.dumps(build_request("tools/call", {"name": "stats"}, id=1))
    host, port = LOOPBACK, int(url.rsplit(":", 1)[1].split("/")[0])
    reader, writer = await asyncio.open_connection(host, port)
    try:
        async with asyncio.timeout(10):
            writer.write(
                b"POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(body), body)
            )
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.partition(b":")[2])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            answer = orjson.loads(await reader.readexactly(length))
    finally:
        writer.transport.abort()
    stats: dict[str, int] = answer["result"]["structuredContent"]
    return stats


# -- misbehaving clients ------------------------------------------------------------------------


class Window:
    """The attack's time window: it ends at `until`, or at once when `close()` is called, and
    every round running inside `bounded()` ends with it."""

    def __init__(self, seconds: float) -> None:
        self._loop = asyncio.get_running_loop()
        self.until = self._loop.time() + seconds
        self.closed_early: str | None = None
        self._scopes: set[asyncio.Timeout] = set()

    @property
    def open(self) -> bool:
        return self._loop.time() < self.until

    @contextlib.asynccontextmanager
    async def bounded(self) -> AsyncIterator[None]:
        async with asyncio.timeout_at(self.until) as scope:
            self._scopes.add(scope)
            try:
                yield
            finally:
                self._scopes.discard(scope)

    def close(self, why: str) -> None:
        if self.closed_early is None:
            self.closed_early = why
        now = self._loop.time()
        self.until = min(self.until, now)
        for scope in list(self._scopes):
            scope.reschedule(now)


@dataclass
class Round:
    """One connection of an attacker, as far as it got."""

    sent: int = 0
    answers: int = 0
    stalled: bool = False  # a write waits for taskgate to read


@dataclass
class Tally:
    """How each attacker's connections ended, by kind, and what they sent and got."""

    ended: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    sent: Counter[str] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, str]:
        """Per kind: how its connections ended, and what it sent and read, if anything."""
        lines = {}
        for kind, ends in sorted(self.ended.items()):
            line = ", ".join(f"{how} x{n}" for how, n in sorted(ends.items()))
            if self.sent[kind]:
                line += f"; sent {mb(self.sent[kind])}"
            if self.answers[kind]:
                line += f"; answers read {self.answers[kind]}"
            lines[kind] = line
        return lines


Attack = Callable[[int, Round], Awaitable[str]]

# Fast attackers start a new connection at most this often, so that a server that refuses them
# at once does not turn the test into a connection storm (ports in TIME_WAIT, CPU).
MIN_ROUND_S = 0.05
MAX_ROUNDS = 1_000
# Bytes one round sends at most, however fast the server takes them.
MAX_ROUND_BYTES = 64 * MIB


async def run_attacker(kind: str, attack: Attack, port: int, window: Window, tally: Tally) -> None:
    """Rounds of `attack` (one connection each) until the window closes; each round's end is
    tallied: the status taskgate answered, 'closed', 'reset', or, still going at the end,
    'stalled' (taskgate stopped reading it) or 'open at the end'."""
    loop = asyncio.get_running_loop()
    for _ in range(MAX_ROUNDS):
        if not window.open:
            return
        began = loop.time()
        state = Round()
        try:
            async with window.bounded():
                how = await attack(port, state)
        except TimeoutError:
            how = "stalled" if state.stalled else "open at the end"
        except ConnectionError:
            how = "reset"
        except OSError as exc:
            how = f"connect failed ({exc.strerror})"
        tally.ended[kind][how] += 1
        tally.sent[kind] += state.sent
        tally.answers[kind] += state.answers
        pause = began + MIN_ROUND_S - loop.time()
        if pause > 0 and window.open:
            await asyncio.sleep(pause)  # pacing, not synchronisation


@contextlib.asynccontextmanager
async def _connection(
    port: int,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    try:
        yield reader, writer
    finally:
        writer.transport.abort()


async def _status(reader: asyncio.StreamReader) -> str:
    """How taskgate ended the exchange: its status code, or 'closed' / 'reset'."""
    try:
        line = await reader.readline()
    except ConnectionError:
        return "reset"
    parts = line.split()
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/1."):
        return parts[1].decode("ascii", "replace")
    return "closed" if not line else "not HTTP"


async def _send(writer: asyncio.StreamWriter, data: bytes, state: Round) -> None:
    writer.write(data)
    state.sent += len(data)
    state.stalled = True
    await writer.drain()
    state.stalled = False


async def _send_until_answered(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes, blocks: bytes,
    state: Round,
) -> str:  # fmt: skip
    """Send `head`, then `blocks` again and again until taskgate answers or closes (or the
    round's byte cap); the answer's status is the outcome."""
    answer = asyncio.ensure_future(_status(reader))
    try:
        await _send(writer, head, state)
        while not answer.done() and state.sent < MAX_ROUND_BYTES:
            sending = asyncio.ensure_future(_send(writer, blocks, state))
            try:
                await asyncio.wait([answer, sending], return_when=asyncio.FIRST_COMPLETED)
            finally:
                sending.cancel()
            if sending.done() and not sending.cancelled() and sending.exception() is not None:
                break  # taskgate closed while we wrote: its answer, if any, is in the reader
        return await answer
    except ConnectionError:
        return await answer
    finally:
        answer.cancel()


def _request(body: bytes, *, content_length: int | None = None, extra: bytes = b"") -> bytes:
    """A POST to /mcp with the headers of a 2026-07-28 client."""
    message = orjson.loads(body)
    headers = mcp_headers(message["method"], message.get("params", {}))
    lines = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers.items())
    length = len(body) if content_length is None else content_length
    return b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n%s%sContent-Length: %d\r\n\r\n" % (
        lines,
        extra,
        length,
    )


ECHO = orjson.dumps(build_request("tools/call", {"name": "echo", "arguments": {}}, id=1))
GET_ROOT = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def never_read(port: int, state: Round) -> str:
    """Pipelined `GET /` without end, never reading an answer."""
    blob = GET_ROOT * (64 * KIB // len(GET_ROOT))
    async with _connection(port) as (_, writer):
        while state.sent < MAX_ROUND_BYTES:
            await _send(writer, blob, state)
    return "byte cap reached"


async def post_flood_unread(port: int, state: Round) -> str:
    """Pipelined valid tools/call POSTs to the MCP path, never reading an answer."""
    blob = (_request(ECHO) + ECHO) * 128
    async with _connection(port) as (_, writer):
        while state.sent < MAX_ROUND_BYTES:
            await _send(writer, blob, state)
    return "byte cap reached"


async def post_flood_slow(port: int, state: Round) -> str:
    """Pipelined valid tools/call POSTs, their answers read 4 KiB every 50 ms."""
    blob = (_request(ECHO) + ECHO) * 128

    async def read_slowly(reader: asyncio.StreamReader) -> None:
        tail = b""
        while True:
            data = await reader.read(4 * KIB)
            if not data:
                return
            state.answers += (tail + data).count(b"HTTP/1.1 ")
            tail = data[-8:]
            await asyncio.sleep(0.05)  # pacing: the slowness is the point

    async with _connection(port) as (reader, writer):
        slow = asyncio.ensure_future(read_slowly(reader))
        try:
            while state.sent < MAX_ROUND_BYTES and not slow.done():
                await _send(writer, blob, state)
            await slow
        finally:
            slow.cancel()
    return "closed"


SLOW_BODY_LENGTH = 170


async def slow_body(port: int, state: Round) -> str:
    """A valid POST head announcing 170 body bytes, 85 of them sent, then nothing."""
    async with _connection(port) as (reader, writer):
        await _send(writer, _request(ECHO, content_length=SLOW_BODY_LENGTH) + ECHO[:85], state)
        return await _status(reader)


SLOWLORIS_EVERY_S = 0.25


async def slowloris(port: int, state: Round) -> str:
    """A head trickled one header line every 250 ms, never ended."""
    async with _connection(port) as (reader, writer):
        answer = asyncio.ensure_future(_status(reader))
        try:
            await _send(writer, b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n", state)
            for n in range(10_000):
                done, _ = await asyncio.wait([answer], timeout=SLOWLORIS_EVERY_S)
                if done:
                    break
                await _send(writer, b"X-Slow-%d: x\r\n" % n, state)
            return await answer
        finally:
            answer.cancel()


async def oversized_length(port: int, state: Round) -> str:
    """A Content-Length over listen.max_body_bytes, the body sent as fast as taskgate reads."""
    async with _connection(port) as (reader, writer):
        head = _request(ECHO, content_length=MAX_ROUND_BYTES)
        return await _send_until_answered(reader, writer, head, _BODY_BLOCK, state)


async def oversized_chunked(port: int, state: Round) -> str:
    """A chunked body that grows past listen.max_body_bytes, as fast as taskgate reads."""
    async with _connection(port) as (reader, writer):
        head = _request(ECHO, extra=b"Transfer-Encoding: chunked\r\n").replace(
            b"Content-Length: %d\r\n" % len(ECHO), b""
        )
        chunk = b"%x\r\n%s\r\n" % (16 * KIB, b" " * (16 * KIB))
        return await _send_until_answered(reader, writer, head, chunk * 4, state)


async def endless_header_line(port: int, state: Round) -> str:
    """A header line that never ends: no CRLF ever."""
    async with _connection(port) as (reader, writer):
        head = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: "
        return await _send_until_answered(reader, writer, head, _LINE_BLOCK, state)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="a misbehaving MCP replica on loopback")
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(_serve_replica(parser.parse_args().port))
