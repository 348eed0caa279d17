"""The public listener's HTTP/1.1 server (gateway.h1.server) on real loopback sockets, under
asyncio's loop and uvloop.

Each scenario starts its own Server with a small handler of the test's own and talks to it byte
for byte through asyncio.open_connection, since framing is the point; aiohttp's client is used
where a real client is. What is asserted is what a client relies on: the status, the exact
framing of the answer, and whether the connection stays open afterwards. Every scenario runs
under both event loops, as the pool's tests do: taskgate serves on uvloop, in-process tests run
on asyncio's, and their transports differ.

Waits are bounded; the test controls timing through events its handlers wait on, never with a
sleep. Where a test asserts that something does not happen (no interim answer, no cancellation),
it waits a short bounded time for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gc
import re
import socket
import struct
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from gateway.h1.limits import PIPELINE_DEPTH, Limits, Refused
from gateway.h1.request import DownstreamRequest, DownstreamResponse, Handler, Reply
from gateway.h1.server import HTTPConnection, Server

Scenario = Callable[[], Coroutine[Any, Any, None]]
Run = Callable[[Scenario], None]
WAIT = 5.0  # the bound of a wait for something that must happen
SOON = 1.0  # the bound of a wait for something that should happen at once
SMALL = {"max_header_bytes": 100, "max_headers": 5, "max_body_bytes": 50}


# --- the server under test and its peers ----------------------------------------------------


def refusal(status: int, reason: str) -> DownstreamResponse:
    """The server's own refusals, recognisable by their prefix."""
    return DownstreamResponse(
        status=status, body=b"refused: " + reason.encode(), content_type="text/plain"
    )


async def echo(request: DownstreamRequest) -> Reply:
    """Answers with the body it read; a refusal of the body becomes the answer, as the gateway's
    handler turns it into one."""
    try:
        body = await request.read()
    except Refused as exc:
        return DownstreamResponse(status=exc.status, body=exc.reason.encode())
    return DownstreamResponse(body=body, headers={"X-Path": request.path})


class Recording:
    """The server, keeping a weak reference to each connection it made. A wrapper, not a
    subclass: the compiled build's Server admits no interpreted subclass."""

    def __init__(self, handler: Handler, limits: Limits) -> None:
        self.server = Server(handler, limits, refusal)
        self.made: list[weakref.ref[HTTPConnection]] = []

    def __call__(self) -> HTTPConnection:
        conn = self.server()
        self.made.append(weakref.ref(conn))
        return conn

    @property
    def connections(self) -> set[HTTPConnection]:
        return self.server.connections

    @property
    def buffered(self) -> int:
        return self.server.buffered

    @property
    def draining(self) -> bool:
        return self.server.draining

    async def shutdown(self, timeout_s: float) -> None:
        await self.server.shutdown(timeout_s)


@dataclass
class Answer:
    status: int
    head: bytes
    headers: CIMultiDict[str]
    body: bytes

    @property
    def closes(self) -> bool:
        return self.headers.get("Connection", "").lower() == "close"


class Peer:
    """One raw client connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self, *, head_only: bool = False) -> Answer:
        """One answer, framed as a client frames it: by Content-Length, by chunks, or by the
        end of the connection."""
        reader = self.reader
        async with asyncio.timeout(WAIT):
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head[:-4].decode("latin-1").split("\r\n")
            version, status, _ = lines[0].split(" ", 2)
            assert version == "HTTP/1.1", lines[0]
            headers: CIMultiDict[str] = CIMultiDict()
            for line in lines[1:]:
                name, colon, value = line.partition(":")
                assert colon, line
                assert name == name.strip(), line
                headers.add(name, value.strip())
            code = int(status)
            if head_only or code < 200 or code in (204, 304):
                body = b""
            elif "Content-Length" in headers:
                assert "Transfer-Encoding" not in headers
                body = await reader.readexactly(int(headers["Content-Length"]))
            elif headers.get("Transfer-Encoding") == "chunked":
                body = await read_chunks(reader)
            else:
                body = await reader.read()  # to the end of the connection
        return Answer(code, head, headers, body)

    async def rest(self, within: float = WAIT) -> bytes:
        """Whatever comes until the server closes the connection; fails if it stays open."""
        received = b""
        try:
            async with asyncio.timeout(within):
                while data := await self.reader.read(65536):
                    received += data
        except TimeoutError:
            raise AssertionError(f"still open after {within} s; received {received!r}") from None
        except ConnectionError:
            pass  # closed too, if less politely
        return received

    async def closed(self, within: float = WAIT) -> None:
        """The server closes the connection without sending anything more."""
        assert await self.rest(within) == b""

    async def silent(self, seconds: float = 0.1) -> bool:
        """Nothing arrives for a short while (a negative check, so necessarily timed)."""
        try:
            async with asyncio.timeout(seconds):
                await self.reader.readexactly(1)
        except TimeoutError:
            return True
        return False

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(SOON):
                await self.writer.wait_closed()


async def read_chunks(reader: asyncio.StreamReader) -> bytes:
    """A chunked body, strictly: hex size CRLF, data CRLF, ..., 0 CRLF CRLF."""
    body = bytearray()
    while True:
        line = await reader.readuntil(b"\r\n")
        assert re.fullmatch(rb"[0-9a-f]+\r\n", line), line
        size = int(line, 16)
        if size == 0:
            assert await reader.readexactly(2) == b"\r\n"
            return bytes(body)
        body += await reader.readexactly(size)
        assert await reader.readexactly(2) == b"\r\n"


class Served:
    def __init__(self, server: Recording, port: int) -> None:
        self.server = server
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.peers: list[Peer] = []

    async def connect(self, sock: socket.socket | None = None) -> Peer:
        if sock is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        else:
            reader, writer = await asyncio.open_connection(sock=sock)
        peer = Peer(reader, writer)
        self.peers.append(peer)
        return peer

    async def forgets_all(self) -> None:
        """The server drops every connection (a bounded poll: connection_lost signals nothing
        a test could await)."""
        await until(lambda: not self.server.connections)


@contextlib.asynccontextmanager
async def serving(handler: Handler = echo, /, **limits: Any) -> AsyncIterator[Served]:
    server = Recording(handler, Limits(**limits))
    listener = await asyncio.get_running_loop().create_server(server, "127.0.0.1", 0)
    served = Served(server, listener.sockets[0].getsockname()[1])
    try:
        yield served
    finally:
        listener.close()
        for peer in served.peers:
            await peer.close()
        await server.shutdown(0)
        await listener.wait_closed()


async def until(condition: Callable[[], bool], within: float = WAIT) -> None:
    """A bounded poll, for the few states nothing can be awaited on."""
    for _ in range(int(within / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not so within {within} s")


async def happens(event: asyncio.Event, within: float = WAIT) -> bool:
    try:
        async with asyncio.timeout(within):
            await event.wait()
    except TimeoutError:
        return False
    return True


def request_head(method: str, *extra: bytes, path: str = "/") -> bytes:
    head = b"%s %s HTTP/1.1\r\nHost: t\r\n" % (method.encode(), path.encode())
    return head + b"".join(line + b"\r\n" for line in extra) + b"\r\n"


def post(path: str, body: bytes, *extra: bytes) -> bytes:
    head = b"POST %s HTTP/1.1\r\nHost: t\r\n" % path.encode()
    head += b"".join(line + b"\r\n" for line in extra)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def get(path: str = "/", *extra: bytes, version: bytes = b"1.1") -> bytes:
    head = b"GET %s HTTP/%s\r\nHost: t\r\n" % (path.encode(), version)
    return head + b"".join(line + b"\r\n" for line in extra) + b"\r\n"


def without_date(head: bytes) -> bytes:
    return re.sub(rb"\r\nDate: [^\r]*\r\n", b"\r\nDate: *\r\n", head)


# --- 1. keep-alive ------------------------------------------------------------------------------


def test_two_requests_on_one_connection_are_both_answered(run: Run) -> None:
    async def scenario() -> None:
        async with serving() as served:
            peer = await served.connect()
            await peer.send(post("/a", b"one"))
            first = await peer.answer()
            await peer.send(post("/b", b"second"))
            second = await peer.answer()
        assert without_date(first.head) == (
            b"HTTP/1.1 200 OK\r\nDate: *\r\nX-Path: /a\r\nContent-Length: 3\r\n\r\n"
        )
        assert first.body == b"one"
        assert (second.status, second.body, second.headers["X-Path"]) == (200, b"second", "/b")
        for answer in (first, second):
            assert not answer.closes
            sent = parsedate_to_datetime(answer.headers["Date"])
            assert abs(sent - datetime.datetime.now(datetime.UTC)) < datetime.timedelta(seconds=60)

    run(scenario)


def test_a_real_client_reuses_one_connection(run: Run) -> None:
    async def scenario() -> None:
        created: list[object] = []

        async def on_create(
            session: aiohttp.ClientSession, context: SimpleNamespace, params: object
        ) -> None:
            created.append(params)

        trace = aiohttp.TraceConfig()
        trace.on_connection_create_end.append(on_create)
        async with serving() as served, aiohttp.ClientSession(trace_configs=[trace]) as http:
            for n in range(3):
                async with http.post(served.url + "/mcp", data=b"n=%d" % n) as response:
                    assert response.status == 200
                    assert await response.read() == b"n=%d" % n
        assert len(created) == 1

    run(scenario)


def test_connection_close_from_the_client_closes_after_the_answer(run: Run) -> None:
    async def scenario() -> None:
        async with serving() as served:
            peer = await served.connect()
            # A second request after the one that said close is never taken.
            await peer.send(post("/a", b"x", b"Connection: close") + get("/late"))
            answer = await peer.answer()
            assert (answer.status, answer.body, answer.closes) == (200, b"x", True)
            await peer.closed()

    run(scenario)


def test_http10_without_keep_alive_closes_after_the_answer(run: Run) -> None:
    async def scenario() -> None:
        async with serving() as served:
            peer = await served.connect()
            await peer.send(get("/old", version=b"1.0"))
            answer = await peer.answer()
            assert (answer.status, answer.closes) == (200, True)
            assert answer.headers["Content-Length"] == "0"
            await peer.closed()

    run(scenario)


def test_http10_with_keep_alive_keeps_the_connection(run: Run) -> None:
    async def scenario() -> None:
        async with serving() as served:
            peer = await served.connect()
            for path in ("/a", "/b"):
                await peer.send(get(path, b"Connection: keep-alive", version=b"1.0"))
                answer = await peer.answer()
                assert (answer.status, answer.headers["X-Path"], answer.closes) == (
                    200,
                    path,
                    False,
                )

    run(scenario)


# --- 2. pipelining ------------------------------------------------------------------------------


@pytest.mark.parametrize("slow_first", [False, True], ids=["fast", "slow-first"])
def test_pipelined_requests_are_answered_in_order(run: Run, slow_first: bool) -> None:
    async def scenario() -> None:
        started: list[bytes] = []
        first_started = asyncio.Event()
        release = asyncio.Event()

        async def handler(request: DownstreamRequest) -> Reply:
            body = await request.read()
            started.append(body)
            if body == b"first" and slow_first:
                first_started.set()
                await release.wait()
            return DownstreamResponse(body=body)

        async with serving(handler) as served:
            peer = await served.connect()
            await peer.send(post("/", b"first") + post("/", b"second") + post("/", b"third"))
            if slow_first:
                assert await happens(first_started)
                assert started == [b"first"]  # one handler at a time: the others wait
                release.set()
            bodies = [(await peer.answer()).body for _ in range(3)]
            assert bodies == [b"first", b"second", b"third"]
            await peer.send(post("/", b"fourth"))  # and the connection is still usable
            assert (await peer.answer()).body == b"fourth"
        assert started == [b"first", b"second", b"third", b"fourth"]

    run(scenario)


def test_a_pipeline_deeper_than_the_server_reads_ahead_is_answered_in_order(run: Run) -> None:
    async def scenario() -> None:
        release = asyncio.Event()
        first_started = asyncio.Event()

        async def handler(request: DownstreamRequest) -> Reply:
            body = await request.read()
            if body == b"0":
                first_started.set()
                await release.wait()
            return DownstreamResponse(body=body)

        count = 3 * PIPELINE_DEPTH
        async with serving(handler) as served:
            peer = await served.connect()
            half = count // 2
            await peer.send(b"".join(post("/", b"%d" % n) for n in range(half)))
            assert await happens(first_started)
            # More arrive while reading is paused; they wait in the socket, not in memory.
            await peer.send(b"".join(post("/", b"%d" % n) for n in range(half, count)))
            release.set()
            bodies = [(await peer.answer()).body for _ in range(count)]
            assert bodies == [b"%d" % n for n in range(count)]

    run(scenario)


# --- 3. framing and request smuggling -----------------------------------------------------------

MALFORMED = {
    "content-length-and-chunked": b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "chunked-and-content-length": b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Length: 3\r\n\r\n0\r\n\r\n",
    "two-content-lengths": b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"
    b"Content-Length: 3\r\n\r\nabc",
    "two-different-content-lengths": b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"
    b"Content-Length: 4\r\n\r\nabcd",
    "content-length-list": b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3, 3\r\n\r\nabc",
    "content-length-sign": b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: +3\r\n\r\nabc",
    "chunked-not-last": b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"
    b"3\r\nabc\r\n0\r\n\r\n",
    "invalid-chunk-size": b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"zz\r\nabc\r\n0\r\n\r\n",
    "negative-chunk-size": b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabc\r\n-1\r\n\r\n",
    "chunk-data-without-crlf": b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabcX0\r\n\r\n",
    "obs-fold": b"GET / HTTP/1.1\r\nHost: t\r\nX-A: a\r\n b\r\n\r\n",
    "space-before-colon": b"GET / HTTP/1.1\r\nHost : t\r\n\r\n",
    "bare-lf-everywhere": b"GET / HTTP/1.1\nHost: t\n\nGET /second HTTP/1.1\nHost: t\n\n",
    "bare-lf-after-a-header": b"GET / HTTP/1.1\r\nHost: t\n\r\n",
    "bare-lf-ending-the-head": b"GET / HTTP/1.1\r\nHost: t\r\n\n",
}


@pytest.mark.parametrize("wire", MALFORMED.values(), ids=MALFORMED.keys())
def test_ambiguous_framing_is_400_and_the_end_of_the_connection(run: Run, wire: bytes) -> None:
    async def scenario() -> None:
        paths: list[str] = []

        async def handler(request: DownstreamRequest) -> Reply:
            paths.append(request.path)
            return await echo(request)

        async with serving(handler) as served:
            peer = await served.connect()
            # What follows the bad bytes must never be taken for a request of its own.
            await peer.send(wire + get("/smuggled"))
            answer = await peer.answer()
            assert (answer.status, answer.closes) == (400, True), answer
            assert answer.body.startswith((b"refused: Bad request", b"Bad request"))
            await peer.closed()
        assert "/smuggled" not in paths
        assert "/second" not in paths

    run(scenario)


def test_a_chunked_body_is_dechunked_for_the_handler(run: Run) -> None:
    async def scenario() -> None:
        async with serving() as served:
            peer = await served.connect()
            # Split across writes, in the middle of sizes and data; an extension; a trailer.
            await peer.send(b"POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3")
            await peer.send(b"\r\nabc\r\n4;ext=1\r\nde")
            await peer.send(b"fg\r\na\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n")
            answer = await peer.answer()
            assert (answer.status, answer.body) == (200, b"abcdefg0123456789")
            assert not answer.closes
            await peer.send(post("/after", b"ok"))
            assert (await peer.answer()).body == b"ok"

    run(scenario)


def test_a_request_followed_by_garbage_is_answered_then_the_connection_closes(
    run: Run,
) -> None:
    async def scenario() -> None:
        async with serving() as served:
            peer = await served.connect()
            await peer.send(post("/", b"good") + b"\x01garbage\r\n\r\n")
            answer = await peer.answer()
            assert (answer.status, answer.body, answer.closes) == (200, b"good", True)
            await peer.closed()

    run(scenario)


# --- 4. limits ---------------------------------------------------------------------------------


def test_headers_at_the_limits_are_accepted(run: Run) -> None:
    async def scenario() -> None:
        async with serving(**SMALL) as served:
            peer = await served.connect()
            # Five fields (Host is one), each line exactly 100 bytes without its CRLF.
            lines = [b"Host: " + b"h" * 94] + [b"X-%d: " % n + b"v" * 95 for n in range(4)]
            assert all(len(line) == 100 for line in lines)
            await peer.send(b"GET /" + b"u" * 99 + b" HTTP/1.1\r\n" + b"\r\n".join(lines))
            await peer.send(b"\r\n\r\n")
            answer = await peer.answer()
            assert (answer.status, answer.headers["X-Path"]) == (200, "/" + "u" * 99)

    run(scenario)


# A Refused raised in an httptools callback reaches data_received wrapped in
# HttpParserCallbackError; the status it names must survive the wrapping.


def test_a_header_line_over_the_limit_is_431(run: Run) -> None:
    async def scenario() -> None:
        async with serving(**SMALL) as served:
            peer = await served.connect()
            await peer.send(get("/", b"X-Big: " + b"v" * 100))
            answer = await peer.answer()
            assert (answer.status, answer.closes) == (431, True), answer
            await peer.closed()

    run(scenario)


def test_more_header_fields_than_the_limit_is_431(run: Run) -> None:
    async def scenario() -> None:
        async with serving(**SMALL) as served:
            peer = await served.connect()
            await peer.send(get("/", *(b"X-%d: v" % n for n in range(5))))  # six with Host
            answer = await peer.answer()
            assert (answer.status, answer.closes) == (431, True), answer
            await peer.closed()

    run(scenario)


def test_a_url_over_the_limit_is_414(run: Run) -> None:
    async def scenario() -> None:
        async with serving(**SMALL) as served:
            peer = await served.connect()
            await peer.send(get("/" + "u" * 100))
            answer = await peer.answer()
            assert (answer.status, answer.closes) == (414, True), answer
            await peer.closed()

    run(scenario)


def test_limit_refusals_at_least_end_the_connection_and_run_no_handler(run: Run) -> None:
    # What holds today, whatever their status: none of the refusals above reaches a handler,
    # and none leaves the connection open for what follows.
    async def scenario() -> None:
        paths: list[str] = []

        async def handler(request: DownstreamRequest) -> Reply:
            paths.append(request.path)
            return DownstreamResponse()

        async with serving(handler, **SMALL) as served:
            for wire in (
                get("/", b"X-Big: " + b"v" * 100),
                get("/", *(b"X-%d: v" % n for n in range(5))),
                get("/" + "u" * 100),
            ):
                peer = await served.connect()
                await peer.send(wire + get("/smuggled"))
                answer = await peer.answer()
                assert answer.status in (400, 414, 431)
                assert answer.closes
                await peer.closed()
        assert paths == []

    run(scenario)


def test_a_content_length_over_the_limit_is_413_and_the_connection_closes(run: Run) -> None:
    async def scenario() -> None:
        async with serving(**SMALL) as served:
            peer = await served.connect()
            # The handler learns at once, without the 10 MB being sent.
            await peer.send(request_head("POST", b"Content-Length: 10000000") + b"xxxx")
            answer = await peer.answer()
            assert (answer.status, answer.closes) == (413, True)
            assert answer.body == b"Payload too large: the limit is 50 bytes"
            await peer.closed()

    run(scenario)


def test_a_whole_body_over_the_limit_is_413_and_its_connection_stays_framed(run: Run) -> None:
    # The 60 bytes arrived whole with the head and were dropped: the next request is framed
    # where it starts, so the connection may go on (what the code does, and it is safe).
    async def scenario() -> None:
        async with serving(**SMALL) as served:
            peer = await served.connect()
            await peer.send(post("/", b"x" * 60) + post("/", b"y" * 50))
            over = await peer.answer()
            assert (over.status, over.closes) == (413, False)
            at_limit = await peer.answer()
            assert (at_limit.status, at_limit.body) == (200, b"y" * 50)

    run(scenario)


def test_a_chunked_body_growing_over_the_limit_is_413_and_the_connection_closes(
    run: Run,
) -> None:
    async def scenario() -> None:
        async with serving(**SMALL) as served:
            peer = await served.connect()
            await peer.send(b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
            await peer.send(b"3\r\nabc\r\n")
            await peer.send(b"40\r\n" + b"x" * 64 + b"\r\n")  # 67 bytes: over, not ended
            answer = await peer.answer()
            assert (answer.status, answer.closes) == (413, True)
            await peer.closed()

    run(scenario)


def test_an_endless_header_line_is_431_and_its_connection_is_let_go(run: Run) -> None:
    async def scenario() -> None:
        async with serving(**SMALL, read_timeout_s=60) as served:
            peer = await served.connect()
            bound = 100 * (5 + 2)  # max_header_bytes * (max_headers + 2)
            await peer.send(b"GET / HTTP/1.1\r\nX-Endless: " + b"v" * (bound // 2))
            await peer.send(b"v" * (bound // 2 + 10))  # no CRLF, ever
            answer = await peer.answer()
            assert (answer.status, answer.closes) == (431, True)
            assert answer.body.startswith(b"refused: Request header fields too large")
            await peer.closed()
            # Memory is not held: the connection, its parser and the half line are gone.
            await served.forgets_all()
            gc.collect()
            assert [ref() for ref in served.server.made] == [None]

    run(scenario)


# --- 5. time -----------------------------------------------------------------------------------


def test_a_head_that_never_ends_is_408(run: Run) -> None:
    async def scenario() -> None:
        async with serving(read_timeout_s=0.3, keepalive_timeout_s=60) as served:
            peer = await served.connect()
            loop = asyncio.get_running_loop()
            began = loop.time()
            await peer.send(b"GET / HTTP/1.1\r\nHost: t\r\n")
            answer = await peer.answer()
            assert loop.time() - began >= 0.25
            assert (answer.status, answer.closes) == (408, True)
            assert answer.body.startswith(b"refused: Request timeout")
            await peer.closed()

    run(scenario)


def test_a_head_trickled_a_byte_at_a_time_is_408_all_the_same(run: Run) -> None:
    async def scenario() -> None:
        async with serving(read_timeout_s=0.3, keepalive_timeout_s=60) as served:
            peer = await served.connect()
            loop = asyncio.get_running_loop()
            began = loop.time()

            async def trickle() -> None:  # paces the client; synchronises nothing
                with contextlib.suppress(ConnectionError):
                    await peer.send(b"GET / HTTP/1.1\r\nX-Slow: ")
                    for _ in range(200):
                        await asyncio.sleep(0.02)
                        await peer.send(b"v")

            trickling = asyncio.create_task(trickle())
            try:
                answer = await peer.answer()
            finally:
                trickling.cancel()
            # Each byte does not restart the clock: the head had 0.3 s from its first byte.
            assert loop.time() - began < 2.0
            assert (answer.status, answer.closes) == (408, True)

    run(scenario)


def test_a_body_that_stops_half_way_fails_the_handlers_read_with_408(run: Run) -> None:
    async def scenario() -> None:
        refused: list[int] = []

        async def handler(request: DownstreamRequest) -> Reply:
            try:
                await request.read()
            except Refused as exc:
                refused.append(exc.status)
                return DownstreamResponse(status=exc.status, body=b"late")
            return DownstreamResponse()

        async with serving(handler, read_timeout_s=0.3, keepalive_timeout_s=60) as served:
            peer = await served.connect()
            await peer.send(post("/", b"x" * 10)[:-5])
            answer = await peer.answer()
            assert (answer.status, answer.body, answer.closes) == (408, b"late", True)
            await peer.closed()
        assert refused == [408]

    run(scenario)


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(run: Run) -> None:
    async def scenario() -> None:
        async with serving(keepalive_timeout_s=0.3) as served:
            peer = await served.connect()
            await peer.send(post("/", b"x"))
            assert (await peer.answer()).status == 200
            loop = asyncio.get_running_loop()
            answered = loop.time()
            await peer.closed()
            assert loop.time() - answered >= 0.2
            # A connection that never sends a byte goes the same way.
            silent = await served.connect()
            await silent.closed()
            await served.forgets_all()

    run(scenario)


# --- 6. Expect: 100-continue -------------------------------------------------------------------


def test_100_continue_is_sent_only_when_the_handler_reads(run: Run) -> None:
    async def scenario() -> None:
        started = asyncio.Event()
        go = asyncio.Event()

        async def handler(request: DownstreamRequest) -> Reply:
            started.set()
            await go.wait()
            return await echo(request)

        async with serving(handler) as served:
            peer = await served.connect()
            await peer.send(request_head("POST", b"Expect: 100-continue", b"Content-Length: 5"))
            assert await happens(started)
            assert await peer.silent()  # the handler has not read: no 100 yet
            go.set()
            interim = await peer.answer()
            assert interim.head == b"HTTP/1.1 100 Continue\r\n\r\n"
            await peer.send(b"hello")
            answer = await peer.answer()
            assert (answer.status, answer.body, answer.closes) == (200, b"hello", False)
            await peer.send(post("/", b"again"))
            assert (await peer.answer()).body == b"again"

    run(scenario)


def test_a_real_client_waiting_for_100_continue_gets_it(run: Run) -> None:
    async def scenario() -> None:
        async with (
            serving() as served,
            aiohttp.ClientSession() as http,
            http.post(served.url, data=b"body", expect100=True) as response,
        ):
            assert response.status == 200
            assert await response.read() == b"body"

    run(scenario)


def test_an_answer_without_reading_sends_no_100_and_closes(run: Run) -> None:
    async def scenario() -> None:
        async def handler(request: DownstreamRequest) -> Reply:
            return DownstreamResponse(status=401, body=b"who are you")

        async with serving(handler) as served:
            peer = await served.connect()
            await peer.send(request_head("POST", b"Expect: 100-continue", b"Content-Length: 5"))
            answer = await peer.answer()
            assert (answer.status, answer.body, answer.closes) == (401, b"who are you", True)
            # The body the client might still send cannot be told from a request: gone.
            await peer.closed()

    run(scenario)


def test_an_http10_client_gets_no_100_continue(run: Run) -> None:
    async def scenario() -> None:
        started = asyncio.Event()

        async def handler(request: DownstreamRequest) -> Reply:
            started.set()
            return await echo(request)

        async with serving(handler) as served:
            peer = await served.connect()
            await peer.send(b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
            assert await happens(started)
            await peer.send(b"hi")
            answer = await peer.answer()
            assert (answer.status, answer.body) == (200, b"hi")

    run(scenario)


# --- 7. a client that leaves ------------------------------------------------------------------


def waiting_handler(started: asyncio.Event, cancelled: asyncio.Event) -> Handler:
    async def handler(request: DownstreamRequest) -> Reply:
        started.set()
        try:
            await asyncio.Event().wait()  # an upstream that never answers
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return DownstreamResponse()

    return handler


def test_a_client_that_resets_its_connection_cancels_its_handler(run: Run) -> None:
    async def scenario() -> None:
        started, cancelled = asyncio.Event(), asyncio.Event()
        async with serving(waiting_handler(started, cancelled)) as served:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", served.port))
            peer = await served.connect(sock)
            await peer.send(get("/wait"))
            assert await happens(started)
            peer.writer.transport.abort()  # SO_LINGER 0: a reset
            assert await happens(cancelled)
            await served.forgets_all()

    run(scenario)


def test_a_client_that_closes_its_connection_cancels_its_handler(run: Run) -> None:
    async def scenario() -> None:
        started, cancelled = asyncio.Event(), asyncio.Event()
        async with serving(waiting_handler(started, cancelled)) as served:
            peer = await served.connect()
            await peer.send(get("/wait"))
            assert await happens(started)
            await peer.close()  # what a client that gives up does: close(), a FIN
            assert await happens(cancelled, SOON)

    run(scenario)


def test_a_client_that_ends_its_side_half_way_through_a_body_is_let_go(run: Run) -> None:
    # The handler's read raises ConnectionResetError, which echo lets through as the gateway's
    # own handler does; the connection must not stay open (both timers are off by then) nor
    # stay in server.connections.
    async def scenario() -> None:
        async with serving(read_timeout_s=0.3, keepalive_timeout_s=0.3) as served:
            peer = await served.connect()
            await peer.send(post("/", b"x" * 10)[:-5])
            peer.writer.write_eof()
            await peer.rest(SOON)  # whatever it says, the server must close
            await served.forgets_all()

    run(scenario)


# --- 8. streams -------------------------------------------------------------------------------

SSE = {"Content-Type": "text/event-stream"}


async def streaming(request: DownstreamRequest) -> Reply:
    """Two events; /open leaves the end to the server, /cut cuts after the first."""
    stream = request.stream(200, SSE)
    await stream.write(b"data: 1\n\n")
    if request.path == "/cut":
        request.cut()
        return stream
    await stream.write(b"data: 2\n\n")
    if request.path != "/open":
        await stream.end()
    return stream


@pytest.mark.parametrize("path", ["/ended", "/open"])
def test_a_stream_is_chunked_on_http11_and_the_connection_goes_on(run: Run, path: str) -> None:
    async def scenario() -> None:
        async with serving(streaming) as served:
            peer = await served.connect()
            await peer.send(get(path))
            head = await peer.reader.readuntil(b"\r\n\r\n")
            assert without_date(head) == (
                b"HTTP/1.1 200 OK\r\nDate: *\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            expected = b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n"
            async with asyncio.timeout(WAIT):
                assert await peer.reader.readexactly(len(expected)) == expected
            await peer.send(get(path))
            again = await peer.answer()
            assert again.body == b"data: 1\n\ndata: 2\n\n"

    run(scenario)


def test_a_stream_on_http10_is_delimited_by_the_close(run: Run) -> None:
    async def scenario() -> None:
        async with serving(streaming) as served:
            peer = await served.connect()
            await peer.send(get("/ended", version=b"1.0"))
            head = await peer.reader.readuntil(b"\r\n\r\n")
            assert without_date(head) == (
                b"HTTP/1.1 200 OK\r\nDate: *\r\nContent-Type: text/event-stream\r\n"
                b"Connection: close\r\n\r\n"
            )
            assert await peer.rest() == b"data: 1\n\ndata: 2\n\n"

    run(scenario)


def test_a_cut_stream_closes_without_its_last_chunk(run: Run) -> None:
    async def scenario() -> None:
        async with serving(streaming) as served:
            peer = await served.connect()
            await peer.send(get("/cut") + get("/after"))
            head = await peer.reader.readuntil(b"\r\n\r\n")
            assert b"Transfer-Encoding: chunked\r\n" in head
            assert await peer.rest() == b"9\r\ndata: 1\n\n\r\n"  # no 0 CRLF CRLF, no /after

            # A real client sees the stream broken, not ended.
            async with aiohttp.ClientSession() as http, http.get(served.url + "/cut") as response:
                assert response.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    await response.read()

    run(scenario)


def test_a_real_client_reads_a_stream(run: Run) -> None:
    async def scenario() -> None:
        async with serving(streaming) as served, aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.get(served.url + "/ended") as response:
                    assert response.headers["Content-Type"] == "text/event-stream"
                    assert [line async for line in response.content] == [
                        b"data: 1\n",
                        b"\n",
                        b"data: 2\n",
                        b"\n",
                    ]

    run(scenario)


def kernel_send_buffer_max() -> int:
    """What the kernel may buffer for one socket's sends (Linux), else a generous guess."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as limits:
            return int(limits.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 8 * 1024 * 1024


def test_a_stream_waits_for_a_client_that_does_not_read(run: Run) -> None:
    async def scenario() -> None:
        piece = b"x" * 65536
        # What may leave the handler before it must wait: the server's socket buffer, plus the
        # client's small receive buffer, its reader's buffer and the transport's, with room.
        bound = kernel_send_buffer_max() + 1024 * 1024
        pieces = 2 * bound // len(piece)  # twice that, were nothing holding the handler back
        written = 0
        finished = asyncio.Event()

        async def handler(request: DownstreamRequest) -> Reply:
            nonlocal written
            stream = request.stream(200, SSE)
            for _ in range(pieces):
                await stream.write(piece)
                written += 1
            await stream.end()
            finished.set()
            return stream

        async with serving(handler) as served:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", served.port))
            peer = await served.connect(sock)
            await peer.send(get("/"))
            # The handler stops making progress: it waits in stream.write (a bounded poll, as
            # a blocked write signals nothing; progress must stop for 0.3 s running).
            still, last = 0, -1
            for _ in range(int(WAIT / 0.01)):
                still = still + 1 if written == last else 0
                last = written
                if still >= 30:
                    break
                await asyncio.sleep(0.01)
            assert still >= 30, f"the handler never waited; it wrote {written} pieces"
            assert not finished.is_set()
            assert 0 < written * len(piece) <= bound, (written, bound)
            # Reading lets it go on, to the end.
            answer = await peer.answer()
            assert answer.body == piece * pieces
            assert await happens(finished)

    run(scenario)


def test_a_handler_failing_mid_stream_cuts_the_stream(run: Run) -> None:
    async def scenario() -> None:
        async def handler(request: DownstreamRequest) -> Reply:
            stream = request.stream(200, SSE)
            await stream.write(b"data: 1\n\n")
            raise RuntimeError("the handler broke")

        async with serving(handler, keepalive_timeout_s=0.5) as served:
            peer = await served.connect()
            await peer.send(get("/"))
            head = await peer.reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            assert await peer.rest(SOON) == b"9\r\ndata: 1\n\n\r\n"

    run(scenario)


# --- 9. HEAD ------------------------------------------------------------------------------------


def test_head_has_the_content_length_and_no_body(run: Run) -> None:
    async def scenario() -> None:
        async def handler(request: DownstreamRequest) -> Reply:
            return DownstreamResponse(body=b"hello world", content_type="text/plain")

        async with serving(handler) as served:
            peer = await served.connect()
            # Pipelined, so a body after the HEAD answer would be read as the next head.
            await peer.send(b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n" + get("/"))
            head = await peer.answer(head_only=True)
            assert (head.status, head.headers["Content-Length"]) == (200, "11")
            assert head.headers["Content-Type"] == "text/plain"
            full = await peer.answer()
            assert (full.status, full.body) == (200, b"hello world")

    run(scenario)


# --- 10. refusals and failures ------------------------------------------------------------------


@pytest.mark.parametrize("after_a_request", [False, True], ids=["fresh", "after-one"])
def test_a_parse_error_while_idle_is_the_refusal_callbacks_400(
    run: Run, after_a_request: bool
) -> None:
    async def scenario() -> None:
        async with serving() as served:
            peer = await served.connect()
            if after_a_request:
                await peer.send(post("/", b"x"))
                assert (await peer.answer()).status == 200
            await peer.send(b"\x01\x02 / HTTP/1.1\r\n\r\n")
            answer = await peer.answer()
            assert (answer.status, answer.closes) == (400, True)
            assert answer.headers["Content-Type"] == "text/plain"
            assert answer.body.startswith(b"refused: Bad request: ")
            await peer.closed()

    run(scenario)


def test_a_failing_handler_is_the_refusal_callbacks_500_and_the_connection_goes_on(
    run: Run,
) -> None:
    async def scenario() -> None:
        async def handler(request: DownstreamRequest) -> Reply:
            if request.path == "/boom":
                raise RuntimeError("the handler broke")
            return await echo(request)

        async with serving(handler) as served:
            peer = await served.connect()
            await peer.send(get("/boom"))
            answer = await peer.answer()
            assert (answer.status, answer.body) == (500, b"refused: Internal error")
            assert answer.headers["Content-Type"] == "text/plain"
            # The request was read whole, so the connection is still framed: it goes on.
            assert not answer.closes
            await peer.send(post("/", b"fine"))
            assert (await peer.answer()).body == b"fine"

    run(scenario)


# --- 11. shutdown -------------------------------------------------------------------------------


def test_shutdown_closes_idle_connections_drains_busy_ones_and_cuts_late_ones(
    run: Run,
) -> None:
    async def scenario() -> None:
        busy_started, stuck_started = asyncio.Event(), asyncio.Event()
        release, stuck_cancelled = asyncio.Event(), asyncio.Event()

        async def handler(request: DownstreamRequest) -> Reply:
            if request.path == "/busy":
                busy_started.set()
                await release.wait()
            elif request.path == "/stuck":
                stuck_started.set()
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    stuck_cancelled.set()
                    raise
            return DownstreamResponse(body=request.path.encode())

        async with serving(handler) as served:
            idle = await served.connect()
            await idle.send(get("/idle"))
            assert (await idle.answer()).status == 200
            busy = await served.connect()
            await busy.send(get("/busy"))
            stuck = await served.connect()
            await stuck.send(get("/stuck"))
            assert await happens(busy_started)
            assert await happens(stuck_started)

            loop = asyncio.get_running_loop()
            began = loop.time()
            draining = asyncio.create_task(served.server.shutdown(0.5))
            await idle.closed()  # at once
            assert not draining.done()
            release.set()
            answer = await busy.answer()
            assert (answer.status, answer.body, answer.closes) == (200, b"/busy", True)
            await busy.closed()
            assert await happens(stuck_cancelled)  # cut after the timeout
            assert await stuck.rest() == b""  # aborted: no answer
            async with asyncio.timeout(WAIT):
                await draining
            assert loop.time() - began >= 0.4
            assert not served.server.connections

    run(scenario)


# --- 12. Upgrade --------------------------------------------------------------------------------

H2C = (b"Connection: Upgrade, HTTP2-Settings", b"Upgrade: h2c", b"HTTP2-Settings: AAMAAABkAAQAAP__")


def test_an_upgrade_request_is_answered_in_http11_then_the_connection_closes(run: Run) -> None:
    async def scenario() -> None:
        paths: list[str] = []

        async def handler(request: DownstreamRequest) -> Reply:
            paths.append(request.path)
            return await echo(request)

        async with serving(handler) as served:
            peer = await served.connect()
            await peer.send(get("/up", *H2C) + get("/after"))
            answer = await peer.answer()
            assert (answer.status, answer.headers["X-Path"], answer.closes) == (200, "/up", True)
            await peer.closed()
        assert paths == ["/up"]

    run(scenario)


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_an_upgrade_request_with_a_body_is_answered_with_its_body_then_the_connection_closes(
    run: Run, split: bool
) -> None:
    # curl --http2 sends POSTs with Upgrade: h2c. llhttp hands the bytes after such a head to
    # the new protocol, so the server reads the body by its length itself; nothing after it
    # is taken for a request.
    async def scenario() -> None:
        async with serving() as served:
            peer = await served.connect()
            wire = post("/up", b"hello", *H2C) + get("/after")
            if split:
                at = wire.index(b"hello") + 2
                await peer.send(wire[:at])
                await peer.send(wire[at:])
            else:
                await peer.send(wire)
            answer = await peer.answer()
            assert (answer.status, answer.body, answer.closes) == (200, b"hello", True)
            await peer.closed()

    run(scenario)


def test_a_chunked_upgrade_request_is_refused(run: Run) -> None:
    async def scenario() -> None:
        async with serving() as served:
            peer = await served.connect()
            head = request_head("POST", *H2C, b"Transfer-Encoding: chunked", path="/up")
            await peer.send(head + b"5\r\nhello\r\n0\r\n\r\n")
            answer = await peer.answer()
            assert (answer.status, answer.closes) == (400, True)
            assert b"does not switch protocols" in answer.body
            await peer.closed()

    run(scenario)


def test_an_upgrade_request_whose_body_never_comes_is_408(run: Run) -> None:
    async def scenario() -> None:
        async with serving(read_timeout_s=0.3) as served:
            peer = await served.connect()
            await peer.send(post("/up", b"hello", *H2C)[:-3])
            answer = await peer.answer()
            assert (answer.status, answer.closes) == (408, True)
            await peer.closed()

    run(scenario)
