"""The public listener's HTTP/1.1 server: llhttp (httptools) parses, this module frames.

Why not aiohttp's server: behind it, taskgate spent more CPU per request in aiohttp's request
and response machinery than in all of its own checks (docs/performance.md; docs/decisions.md,
24). This serves what taskgate's listener needs and no more: requests with a body of bounded
size read whole, answers with Content-Length, and event streams sent chunked with
back-pressure.

The rules a public HTTP/1.1 server owes its clients, and where they are kept:

- framing: llhttp in its strict default, so Content-Length together with Transfer-Encoding,
  a repeated Content-Length, bad chunk sizes, bare LF and obs-fold are parse errors (400 and
  close), never a second interpretation of the same bytes;
- limits: one header line (the request line included) and the number of header fields (431),
  and the body (413); a body over the limit is read and dropped, never buffered;
- time: a request must arrive whole within `read_timeout_s` of its first byte (408), and an
  idle keep-alive connection closes after `keepalive_timeout_s`;
- order: pipelined requests are answered in order, one handler at a time per connection;
- flow control, as uvicorn's FlowControl and aiohttp keep it: at most one request beyond the
  one being answered is parsed ahead (the bytes after it wait unparsed, and reading pauses);
  while the client's socket is full no further request is started and nothing more is read;
- memory: request bytes held (bodies read, pipelined bytes waiting) count against one
  process-wide budget, and a request that would pass it gets 503; answer bytes not yet sent
  count against the process's answer budget (gateway/h1/answers.py) once a relayed answer
  opened the connection's account; connections beyond `max_connections` get 503 and are
  closed (docs/operations.md has the worst case);
- RFC 9112: an HTTP/1.1 request without Host, a request with two, or an HTTP/1.0 request with
  Transfer-Encoding is faulty framing (400 and close); no header written carries CR, LF or NUL;
- an answer sent before its request's body ended closes the connection (Expect:
  100-continue, or a refusal before the body was read), so the rest is never taken for a
  request;
- a client that disconnects cancels its handler; streams wait for a slow client's socket to
  drain instead of filling memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import unquote

import httptools

from gateway.h1.answers import AnswerAccount, AnswerBudget

log = logging.getLogger("taskgate.listener")

# Requests parsed ahead of the one being answered: one, as uvicorn and aiohttp read ahead. The
# bytes after it stay unparsed (at most one read, READ_SIZE) and reading pauses.
PIPELINE_DEPTH = 1
# The most one read from a socket brings (asyncio's selector transports and uvloop alike).
READ_SIZE = 256 * 1024
# The transport's write buffer: past HIGH, pause_writing (nothing more is read or started);
# resume_writing once it is empty, rather than at asyncio's 16 KiB, so that the unsent bytes the
# answer budget counts are looked at again when they reach 0 (the transport says nothing of
# them in between). The kernel's socket buffer keeps the client fed meanwhile.
WRITE_HIGH_WATER = 64 * 1024
WRITE_LOW_WATER = 0
# A larger body is written in pieces of this size. Under uvloop the unsent rest of one write
# keeps the whole written object alive; in pieces, what the transport keeps is within a piece
# of what it reports unsent, which is what the answer budget counts.
WRITE_PIECE = 256 * 1024
_HEAD_END = b"\r\n\r\n"
# RFC 9112 3.2 / RFC 3986 3.2.2-3.2.3: a Host value is an authority without userinfo.
_HOST = re.compile(rb"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~!$&'()*+,;=%-]*)(?::[0-9]*)?")


@dataclass(frozen=True, slots=True)
class Limits:
    max_header_bytes: int = 8190
    max_headers: int = 100
    max_body_bytes: int = 4 * 1024 * 1024
    read_timeout_s: float = 10.0
    keepalive_timeout_s: float = 75.0
    max_connections: int = 10_000
    max_buffered_bytes: int = 128 * 1024 * 1024
    max_requests_per_connection: int | None = None
    max_head_bytes: int | None = None

    @property
    def head_bound(self) -> int:
        """The bytes of one request head, request line included (431 past it); also what a
        head may make the server hold while it never ends a line."""
        if self.max_head_bytes is not None:
            return self.max_head_bytes
        return self.max_header_bytes * (self.max_headers + 2)


class Refused(Exception):
    """The server refuses the request with this status; `reason` is for the client. A 503 is
    retryable: the client may send the same request again shortly."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class BadHeaderValue(ValueError):
    """A header of an answer would carry CR, LF or NUL (or a character latin-1 cannot encode):
    written, it could split the answer, so it never is."""


class DownstreamResponse:
    """An answer to the downstream client, sent whole, with Content-Length."""

    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(
        self,
        status: int = 200,
        body: bytes = b"",
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers if headers is not None else {}


class Stream:
    """An answer sent as it comes; its head is on the wire once it exists."""

    __slots__ = ("_chunked", "_conn", "_ended", "status")

    def __init__(self, conn: HTTPConnection, status: int, *, chunked: bool) -> None:
        self._conn = conn
        self._chunked = chunked
        self.status = status
        self._ended = False

    async def write(self, data: bytes) -> None:
        """Send one piece; waits while the client's socket is full. ConnectionResetError once
        the client has gone."""
        if data:
            await self._conn.send_chunk(data, self._chunked)

    async def end(self) -> None:
        if not self._ended:
            self._ended = True
            await self._conn.send_chunk(b"", self._chunked)


class Headers:
    """A request's header values by case-insensitive name, decoded when asked for as aiohttp
    decodes them (UTF-8, any other byte kept as a surrogate). Indexed while the head is
    parsed: cheaper than building a multidict of every header, when a request asks for a few."""

    __slots__ = ("_index",)

    def __init__(self, index: dict[bytes, list[bytes]]) -> None:
        self._index = index

    def get(self, name: str, default: str | None = None) -> str | None:
        values = self._index.get(_key(name))
        return _text(values[0]) if values else default

    def getall(self, name: str, default: tuple[()] = (), /) -> list[str] | tuple[()]:
        values = self._index.get(_key(name))
        return [_text(value) for value in values] if values else default


def _text(value: bytes) -> str:
    return value.decode("utf-8", "surrogateescape")


# Header names asked for, lower-cased as bytes once: the code asks for a handful.
_keys: dict[str, bytes] = {}


def _key(name: str) -> bytes:
    key = _keys.get(name)
    if key is None:
        key = name.lower().encode("latin-1")
        if len(_keys) < 256:
            _keys[name] = key
    return key


OVER_BUDGET = "Service unavailable: taskgate holds as many request bytes as it may; retry"

Reply = DownstreamResponse | Stream
Handler = Callable[["DownstreamRequest"], Awaitable[Reply]]
# Renders the server's own refusals (400, 408, 413, 414, 431, 500) in the caller's format.
Refusal = Callable[[int, str], DownstreamResponse]


class DownstreamRequest:
    """One parsed request of a downstream client; its body arrives as the handler runs and is
    read whole, once."""

    __slots__ = (
        "_body",
        "_complete",
        "_conn",
        "_continue",
        "_error",
        "_held",
        "_index",
        "_size",
        "_timer",
        "_waiter",
        "content_length",
        "http10",
        "keep_alive",
        "method",
        "path",
        "raw_headers",
    )

    def __init__(self, conn: HTTPConnection) -> None:
        self._conn = conn
        self.method = ""  # set once the head is parsed
        self.path = ""
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.content_length: int | None = None
        self.keep_alive = True
        self.http10 = False
        self._index: dict[bytes, list[bytes]] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._held = 0  # body bytes counted against the server's budget
        self._complete = False
        self._continue = False  # the client sent Expect: 100-continue and waits for it
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def headers(self) -> Headers:
        return Headers(self._index)

    @property
    def content_type(self) -> str:
        """The media type without parameters, lower-cased; empty when there is none."""
        values = self._index.get(b"content-type")
        return _text(values[0]).partition(";")[0].strip().lower() if values else ""

    @property
    def body_complete(self) -> bool:
        return self._complete

    async def read(self) -> bytes:
        """The whole body. Refused (413, 408, 400) when it is over the limit, late or broken;
        ConnectionResetError when the client left first."""
        while not self._complete and self._error is None:
            if self._continue:
                self._continue = False
                self._conn.send_raw(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._error is not None:
            raise self._error
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = [body]
        return body

    def answers(self, budget: AnswerBudget) -> AnswerAccount:
        """This connection's account of the process's answer budget, opened at its first
        relayed answer; what the relay reads from a replica for the client is counted there."""
        return self._conn.answer_account(budget)

    def stream(self, status: int, headers: dict[str, str]) -> Stream:
        """Send the head of a streamed answer now; the body follows through the Stream."""
        return self._conn.start_stream(self, status, headers)

    def cut(self) -> None:
        """Close the connection after what was sent, without ending the answer: a streamed
        answer that cannot go on must not look complete to the client."""
        self._conn.cut()

    # -- fed by the connection ------------------------------------------------------------------

    def _feed(self, chunk: bytes, limit: int) -> None:
        self._size += len(chunk)
        if self._error is not None:
            return
        if self._size > limit:
            self._drop()
            self._fail(_too_large(limit))
        else:
            server = self._conn._server
            if server.buffered + len(chunk) > server.limits.max_buffered_bytes:
                self._drop()
                self._fail(Refused(503, OVER_BUDGET))
            else:  # counted against the server's budget until the request is answered
                server.buffered += len(chunk)
                self._held += len(chunk)
                self._body.append(chunk)

    def _drop(self) -> None:
        """Let go of the body: answered, refused, or its client gone."""
        self._body = []
        if self._held:
            self._conn._let_go(self._held)
            self._held = 0

    def _finish(self) -> None:
        self._complete = True
        self._disarm()
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._disarm()
        self._wake()

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class Server:
    """A protocol factory for `loop.create_server`, and the set of its open connections.

    `answers`, the process's answer budget, opens every connection's account at once, so that
    the server's own answers count too; without it a connection's account opens with the first
    answer the relay reads for it (DownstreamRequest.answers)."""

    def __init__(
        self,
        handler: Handler,
        limits: Limits,
        refusal: Refusal,
        answers: AnswerBudget | None = None,
    ) -> None:
        self.handler = handler
        self.limits = limits
        self.refusal = refusal
        self.answers = answers
        self.connections: set[HTTPConnection] = set()
        self.draining = False
        # Request bytes held over all connections: bodies read and pipelined bytes waiting.
        self.buffered = 0
        self._all_closed: asyncio.Event | None = None

    def __call__(self) -> HTTPConnection:
        return HTTPConnection(self)

    async def shutdown(self, timeout_s: float) -> None:
        """Stop taking requests: idle connections close now, busy ones after their answer; what
        is still open after `timeout_s` is cut, which cancels its handlers. The caller closes
        the listening sockets first."""
        self.draining = True
        for conn in list(self.connections):
            conn.close_when_idle()
        if self.connections:
            self._all_closed = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._all_closed.wait()
        busy = sum(1 for conn in self.connections if conn.busy)
        if busy:
            log.warning("%d connections still busy after the drain; closing them", busy)
        for conn in list(self.connections):
            conn.abort()

    def _closed(self, conn: HTTPConnection) -> None:
        self.connections.discard(conn)
        if not self.connections and self._all_closed is not None:
            self._all_closed.set()


class HTTPConnection(asyncio.Protocol):
    """One client connection: parses requests, runs their handler in order, writes answers."""

    def __init__(self, server: Server) -> None:
        self._server = server
        limits = self._limits = server.limits
        # Read on every header of every request: kept as plain attributes.
        self._max_line = limits.max_header_bytes
        self._max_fields = limits.max_headers
        self._head_bound = limits.head_bound
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._parsing: DownstreamRequest | None = None  # the request whose bytes are arriving
        self._url = b""
        self._head_bytes = 0  # fed while the head has not ended (an unfinished line included)
        self._head_size = 0  # the parsed head's request line and header lines
        # parsed, waiting for the one being answered
        self._queue: deque[DownstreamRequest] = deque()
        self._active: DownstreamRequest | None = None  # the one whose handler runs
        self._starting = False  # _active's handler starts once the bytes in hand are parsed
        self._task: asyncio.Task[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_answer = 0.0
        self._requests = 0  # requests whose head was parsed on this connection
        self._closing = False  # no new request: close once those in hand are answered
        self._broken = False  # the bytes cannot be framed: nothing more is parsed
        self._stash = b""  # bytes received, held unparsed while a request waits its turn
        self._read_paused = False
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._streaming = False  # the active answer's head is on the wire
        # an upgrade request whose body llhttp skips
        self._raw_body: DownstreamRequest | None = None
        # Answer bytes held for this client, against the process's budget (Server.answers).
        self._account: AnswerAccount | None = None

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        cast(asyncio.WriteTransport, transport).set_write_buffer_limits(
            WRITE_HIGH_WATER, WRITE_LOW_WATER
        )
        server = self._server
        if server.draining:
            server.connections.add(self)
            self.abort()
            return
        if len(server.connections) >= self._limits.max_connections:
            # Not counted, not read: one answer that says why, and the end.
            self._closing = self._broken = True
            limit = self._limits.max_connections
            self._send_refusal(503, f"Service unavailable: taskgate has {limit} connections open")
            self._close()
            return
        server.connections.add(self)
        if server.answers is not None:
            self._account = server.answers.account()
        self._last_answer = self._loop.time()
        self._idle_timer = self._loop.call_at(
            self._last_answer + self._limits.keepalive_timeout_s, self._idle_check
        )

    def data_received(self, data: bytes) -> None:
        if (
            self._active is None
            and self._parsing is None
            and not self._queue
            and not self._stash
            and not self._closing
            and not self._broken
            and self._raw_body is None
        ):
            # Most reads bring one new request (at most one head): fed whole, at once.
            first = data.find(_HEAD_END)
            if first < 0 or data.find(_HEAD_END, first + 4) < 0:
                self._feed(data, 0, data)
                self._consumed(True)
                return
        if self._raw_body is not None:
            self._feed_raw(data)
        elif not self._takes_bytes():
            return  # refused or ending: nothing more is read as a request
        elif self._stash:
            # Bytes that arrived before reading paused: they queue behind those held.
            self._stash_more(data)
        else:
            self._consume(data, eager=True)

    def _consume(self, data: bytes, *, eager: bool) -> None:
        """Parse `data` up to the end of the first request beyond the one being answered; the
        rest waits unparsed (the stash) until that request's turn comes. llhttp cannot stop
        mid-buffer, so the buffer is fed in slices: each ends where a head ends (CRLF CRLF,
        which strict llhttp requires) or, in a body of known length, where the body ends. A
        slice then completes at most one head, and parsing stops once a request waits."""
        if data and self._takes_bytes():
            rest = self._feed_slices(data, data.find(_HEAD_END))
            if rest and self._takes_bytes():
                if self._hold(len(rest)):
                    self._stash = rest
                else:
                    self._over_budget()
        self._consumed(eager)

    def _consumed(self, eager: bool) -> None:
        """What follows parsing: the read timeout of a request still arriving, the start of
        the handler of one that became the active one, and reading on or paused."""
        if self._parsing is not None:
            self._arm(self._parsing)
        if self._starting:
            # The body that came with the head is parsed by now: the handler reads it
            # without waiting.
            self._starting = False
            assert self._active is not None
            start = _eager_task if eager else _task
            self._task = start(self._loop, self._serve(self._active))
        if (
            self._read_paused
            or self._queue
            or self._stash
            or self._closing
            or self._write_paused
            or self._broken
        ):
            self._update_reading()  # otherwise reading goes on, as it is

    def _feed_slices(self, data: bytes, cut: int) -> bytes:
        """Feed `data` slice by slice; returns what is left unparsed once a request waits."""
        view = memoryview(data)
        pos = 0
        end = len(data)
        while pos < end:
            if self._queue or self._raw_body is not None or not self._takes_bytes():
                break
            parsing = self._parsing
            if parsing is not None and parsing.method and parsing.content_length is not None:
                stop = pos + parsing.content_length - parsing._size
            else:
                if cut < pos:
                    cut = data.find(_HEAD_END, pos)
                stop = end if cut < 0 else cut + 4
            stop = min(stop, end)
            self._feed(view[pos:stop], pos, data)
            pos = stop
        if self._raw_body is not None:
            return b""  # _feed handed the rest to the upgrade request's body
        return data[pos:] if pos < end else b""

    def _feed(self, data: bytes | memoryview, offset: int, whole: bytes) -> None:
        """One slice into llhttp; a head that never ends and parse errors are refused here."""
        in_head = self._parsing is None or not self._parsing.method
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            # taskgate speaks HTTP/1.1 only: the request is answered, then the connection ends.
            self._closing = True
            if self._raw_body is not None:
                self._feed_raw(whole[offset + upgrade.args[0] :])
            else:
                self._broken = True
        except httptools.HttpParserError as exc:
            # A limit raised in a callback arrives wrapped by httptools.
            refused = exc.__context__
            if isinstance(refused, Refused):
                self._refuse(refused.status, refused.reason)
            else:
                self._refuse(400, f"Bad request: {_reason(exc)}")
            return
        parsing = self._parsing
        if in_head and parsing is not None and not parsing.method and not self._broken:
            # httptools gathers a header line whole before handing it over: bound what a
            # client can make taskgate hold while it never ends one.
            self._head_bytes += len(data)
            if self._head_bytes > self._head_bound:
                self._refuse(431, "Request header fields too large")

    def _stash_more(self, data: bytes) -> None:
        if self._hold(len(data)):
            self._stash += data
        else:
            self._over_budget()
        self._update_reading()

    def _over_budget(self) -> None:
        """Bytes that do not fit the process's budget are dropped: nothing after them may be
        parsed (it would be spliced onto what came before), the request they belong to gets
        503, those complete in hand are answered, then the connection ends."""
        self._closing = self._broken = True
        if self._parsing is not None:
            self._parsing._fail(Refused(503, OVER_BUDGET))

    def _feed_raw(self, data: bytes) -> None:
        """The body of an upgrade request, by its Content-Length; nothing after it is read."""
        request = self._raw_body
        assert request is not None
        assert request.content_length is not None
        left = request.content_length - request._size
        request._feed(data[:left], self._limits.max_body_bytes)
        if request._size >= request.content_length:
            self._raw_body = None
            self._parsing = None
            self._broken = True
            request._finish()
        elif request._error is None:
            self._arm(request)
        self._update_reading()

    def _arm(self, request: DownstreamRequest | None) -> None:
        """The read timeout of a request whose bytes are still to come from the client. Only
        a request split across reads needs one (most arrive in one), and never one whose
        bytes taskgate holds back itself (it waits its turn; reading is paused)."""
        if (
            request is not None
            and request._timer is None
            and not request._complete
            and request._error is None
            and not self._queue
            and not self._stash
            and not self._broken
            and (request is self._raw_body or not self._closing or request is self._active)
        ):
            request._timer = self._loop.call_later(
                self._limits.read_timeout_s, self._expire, request
            )

    def eof_received(self) -> bool:
        # A client that ends its side has gone, as aiohttp's server took it: the transport
        # closes, connection_lost cancels the handler and with it the upstream call. Keeping
        # half-closed connections open would let a client that left hold a backend's work.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = self._broken = True
        self._transport = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        gone = ConnectionResetError("the client closed the connection")
        for request in (self._active, self._parsing, *self._queue):
            if request is not None:
                request._fail(gone)
                request._drop()
        self._queue.clear()
        if self._stash:
            self._let_go(len(self._stash))
            self._stash = b""
        if self._task is not None:
            self._task.cancel()  # the handler's upstream call ends with it
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(gone)
        if self._account is not None:
            self._account.close()  # the transport's unsent bytes die with it
        self._server._closed(self)

    def pause_writing(self) -> None:
        # The client does not read as fast as taskgate answers: nothing more is read or
        # started until its socket drains (resume_writing).
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        account = self._account
        if account is not None and self._transport is not None:
            # The buffer is empty (WRITE_LOW_WATER): the client took all of it.
            account.sent(self._transport.get_write_buffer_size())
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if self._active is None and self._queue and self._transport is not None:
            self._advance()
        else:
            self._update_reading()

    # -- httptools callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._parsing = DownstreamRequest(self)
        self._url = b""
        self._head_bytes = 0
        self._head_size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self._limits.max_header_bytes:
            raise Refused(414, "URI too long")
        self._head_size = len(self._url)

    def on_header(self, name: bytes, value: bytes) -> None:
        request = self._parsing
        assert request is not None
        line = len(name) + len(value) + 2
        if line > self._max_line:
            raise Refused(431, "Request header fields too large: a header line is too long")
        raw = request.raw_headers
        if len(raw) >= self._max_fields:
            raise Refused(431, "Request header fields too large: too many header fields")
        self._head_size += line + 2
        raw.append((name, value))

    def on_headers_complete(self) -> None:
        request = self._parsing
        assert request is not None
        parser = self._parser
        request.http10 = parser.get_http_version() == "1.0"
        chunked = False
        hosts = 0
        host = b""
        index = request._index
        for name, value in request.raw_headers:
            lowered = name.lower()
            values = index.get(lowered)
            if values is None:
                index[lowered] = [value]
            else:
                values.append(value)
            if lowered == b"content-length":
                request.content_length = int(value)  # llhttp checked it: digits, only one
            elif lowered == b"host":
                hosts += 1
                host = value
            elif lowered == b"expect" and value.strip().lower() == b"100-continue":
                request._continue = not request.http10  # RFC 9110 10.1.1: ignored from 1.0
            elif lowered == b"transfer-encoding":
                chunked = True
        # RFC 9112: faulty framing, answered 400 and the end of the connection, never served.
        if chunked and request.http10:
            raise Refused(400, "Bad request: Transfer-Encoding in an HTTP/1.0 request")
        if hosts > 1:
            raise Refused(400, "Bad request: more than one Host header")
        if hosts == 0 and not request.http10:
            raise Refused(400, "Bad request: an HTTP/1.1 request must carry a Host header")
        if hosts and not (_hosts.get(host) or _host_ok(host)):
            raise Refused(400, "Bad request: the Host header is not a host name")
        if self._head_size > self._head_bound:
            raise Refused(431, "Request header fields too large: the head is too large")
        request.path = _path(self._url)
        request.method = parser.get_method().decode("ascii")
        request.keep_alive = parser.should_keep_alive()
        limit = self._limits.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            request._fail(_too_large(limit))
        elif parser.should_upgrade() and (chunked or request.content_length):
            # taskgate ignores Upgrade (RFC 9110 7.8 lets it), but llhttp hands the bytes after
            # an upgrade request's head to the new protocol: its body is read here, by its
            # length (curl --http2 sends such requests), and the connection ends after it.
            if chunked:
                reason = "Bad request: taskgate does not switch protocols; send it without Upgrade"
                request._fail(Refused(400, reason))
            else:
                self._raw_body = request
        self._requests += 1
        most = self._limits.max_requests_per_connection
        if most is not None and self._requests >= most:
            self._closing = True  # this one is the last: its answer says Connection: close
        if self._active is None and not self._queue:
            self._active = request
            self._starting = True
        else:
            # Its turn comes after the one being answered: its bytes wait, so does its timer.
            request._disarm()
            self._queue.append(request)

    def on_body(self, body: bytes) -> None:
        assert self._parsing is not None
        self._parsing._feed(body, self._limits.max_body_bytes)

    def on_message_complete(self) -> None:
        assert self._parsing is not None
        if self._parsing is not self._raw_body:  # its body is still to come
            self._parsing._finish()
            self._parsing = None

    # -- answering ------------------------------------------------------------------------------

    async def _serve(self, request: DownstreamRequest) -> None:
        try:
            reply = await self._server.handler(request)
        except ConnectionResetError:
            # The client left, or half-closed before its body ended: nothing to answer.
            request._drop()
            self._active = None
            self._task = None
            self._close()
            return
        except Exception:
            log.exception("unexpected failure while serving a request")
            if self._streaming:
                self.cut()  # a status line is on the wire: the stream must not look complete
                return
            reply = self._server.refusal(500, "Internal error")
        if isinstance(reply, DownstreamResponse):
            self._send(request, reply)
        elif not reply._ended and self._transport is not None and not self._transport.is_closing():
            try:
                await reply.end()
            except ConnectionResetError:
                return
        self._next(request)

    def _next(self, answered: DownstreamRequest) -> None:
        if answered._held:
            answered._drop()
        account = self._account
        if account is not None and account.reading and self._transport is not None:
            # A stream, or an answer not sent as read (an error instead): the relay holds
            # nothing of it now.
            account.answered(self._transport.get_write_buffer_size())
        self._active = None
        self._task = None
        self._streaming = False
        if self._transport is None or self._transport.is_closing():
            return  # cut, or closed by a refusal: nothing more is served here
        if not (answered.keep_alive and answered.body_complete):
            # Answered before its body ended: the bytes that follow cannot be framed safely.
            self._close()
        elif self._queue:
            if not self._write_paused:
                self._advance()
            else:  # the client is not reading: resume_writing starts the next one
                self._last_answer = self._loop.time()
        elif self._closing:
            self._close()
        else:
            self._last_answer = self._loop.time()
            if self._read_paused:
                self._update_reading()

    def _advance(self) -> None:
        """The next pipelined request's turn: its held bytes are parsed, then it starts, on
        the next round of the loop rather than inside this one, so that a long pipeline of
        requests answered at once never nests."""
        self._active = self._queue.popleft()
        self._starting = True
        stash, self._stash = self._stash, b""
        if stash:
            self._let_go(len(stash))
        self._consume(stash, eager=False)

    def _send(self, request: DownstreamRequest, response: DownstreamResponse) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        try:
            lines = _header_lines(response.headers, response.content_type)
        except BadHeaderValue as exc:
            log.error("an answer was not sent: %s", exc)
            response = self._server.refusal(500, "Internal error")
            lines = _header_lines(response.headers, response.content_type)
        body = response.body
        sent = body if request.method != "HEAD" else b""
        whole = len(sent) <= WRITE_PIECE
        transport.write(
            b"".join(
                (
                    _status_line(response.status),
                    b"Date: ",
                    _date(),
                    b"\r\n",
                    lines,
                    b"" if self._keeps(request) else b"Connection: close\r\n",
                    b"Content-Length: %d\r\n\r\n" % len(body),
                    sent if whole else sent[:WRITE_PIECE],
                )
            )
        )
        if not whole:
            _write_pieces(transport, sent)
        account = self._account
        if account is not None:
            account.answered(transport.get_write_buffer_size())

    def _send_refusal(self, status: int, reason: str) -> None:
        """The server's own answer, the last on this connection."""
        request = DownstreamRequest(self)
        request.keep_alive = False
        response = self._server.refusal(status, reason)
        if status == 503:
            response.headers.setdefault("Retry-After", "1")
        self._send(request, response)

    def _keeps(self, request: DownstreamRequest) -> bool:
        """Whether the connection stays open after this answer; the answer says so if not."""
        keep = request.keep_alive and request.body_complete
        if keep and (self._server.draining or (self._closing and not self._queue)):
            keep = False
        request.keep_alive = keep
        return keep

    def start_stream(
        self, request: DownstreamRequest, status: int, headers: dict[str, str]
    ) -> Stream:
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        lines = _header_lines(headers, None)  # BadHeaderValue before anything is written
        head = [_status_line(status), b"Date: ", _date(), b"\r\n", lines]
        if request.http10:
            # HTTP/1.0 has no chunks: the end of the connection ends the stream.
            request.keep_alive = False
            head.append(b"Connection: close\r\n\r\n")
        elif not self._keeps(request):
            head.append(b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n")
        else:
            head.append(b"Transfer-Encoding: chunked\r\n\r\n")
        transport.write(b"".join(head))
        self._streaming = True
        return Stream(self, status, chunked=not request.http10)

    async def send_chunk(self, data: bytes, chunked: bool) -> None:
        """One piece of a stream; b"" ends it. Waits while the client's socket is full."""
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        if chunked:
            transport.write(b"%x\r\n%s\r\n" % (len(data), data) if data else b"0\r\n\r\n")
        elif data:
            transport.write(data)
        account = self._account
        if account is not None:
            account.sent(transport.get_write_buffer_size())
        if self._write_paused:
            self._drained = self._loop.create_future()
            try:
                await self._drained
            finally:
                self._drained = None

    def answer_account(self, budget: AnswerBudget) -> AnswerAccount:
        account = self._account
        transport = self._transport
        if account is None:
            account = self._account = budget.account()
            if transport is None:
                account.close()  # already gone: nothing it is sent will count
        elif account.unsent and transport is not None:
            # Looked at after the last write: below the high-water mark the transport never
            # says when the client took the rest.
            account.sent(transport.get_write_buffer_size())
        return account

    def send_raw(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    # -- memory ---------------------------------------------------------------------------------

    def _hold(self, size: int) -> bool:
        """Count `size` request bytes against the server's budget, if they fit."""
        server = self._server
        if server.buffered + size > self._limits.max_buffered_bytes:
            return False
        server.buffered += size
        return True

    def _let_go(self, size: int) -> None:
        self._server.buffered -= size

    # -- ending ---------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._active is not None

    def close_when_idle(self) -> None:
        self._closing = True
        if self._active is None:
            self._close()
        else:
            self._update_reading()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def cut(self) -> None:
        self._close()

    def _close(self) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.close()
            if transport.get_write_buffer_size():
                # The transport closes once its buffer is flushed: a client that never reads
                # would keep the connection and its unsent bytes for good. It gets the idle
                # timeout to take them, then the connection is cut.
                self._loop.call_later(self._limits.keepalive_timeout_s, transport.abort)

    def _refuse(self, status: int, reason: str) -> None:
        """The bytes cannot be framed: nothing after them is read. A request whose handler
        runs, or waits its turn, learns it from its body; otherwise the refusal is the answer
        and the last one, or, behind answers still due, the connection ends after them."""
        self._closing = self._broken = True
        self._update_reading()
        parsing = self._parsing
        if parsing is not None and (parsing is self._active or parsing in self._queue):
            parsing._fail(Refused(status, reason))
            return
        if parsing is not None:
            parsing._disarm()
        if self._active is None and not self._queue:
            self._send_refusal(status, reason)
            self._close()

    def _expire(self, request: DownstreamRequest) -> None:
        """The read timeout of `request`, which has not arrived whole."""
        request._timer = None
        timeout = self._limits.read_timeout_s
        if request.method:  # its handler answers 408 when it reads the body
            reason = f"Request timeout: the body did not arrive within {timeout:g} s"
            request._fail(Refused(408, reason))
            self._closing = self._broken = True
            self._update_reading()
        else:
            self._refuse(408, f"Request timeout: the request did not arrive within {timeout:g} s")

    def _update_reading(self) -> None:
        """Read while a request is wanted: none waits its turn, nothing is held unparsed, the
        client reads what it is sent, and the connection takes requests (or the one being
        answered still has body to come)."""
        transport = self._transport
        if transport is None:
            return
        wanted = (
            not self._broken
            and not self._write_paused
            and not self._queue
            and not self._stash
            and (not self._closing or self._awaits_body())
        )
        if wanted == self._read_paused:
            self._read_paused = not wanted
            if wanted:
                transport.resume_reading()
            else:
                transport.pause_reading()

    def _awaits_body(self) -> bool:
        active = self._active
        return active is not None and active is self._parsing and not active._complete

    def _takes_bytes(self) -> bool:
        """Whether bytes from the client are parsed: not after a refusal, and once the
        connection is ending only those of a body still to come."""
        if self._broken:
            return False
        if not self._closing:
            return True
        parsing = self._parsing
        return parsing is not None and bool(parsing.method)  # a request in hand, mid-body

    def _idle_check(self) -> None:
        """One timer per connection, moved on when it fires rather than at every answer."""
        busy = self._active is not None or self._parsing is not None
        due = self._last_answer + self._limits.keepalive_timeout_s
        if not busy and self._loop.time() >= due:
            self._idle_timer = None
            self._close()
            return
        if busy:
            due = self._loop.time() + self._limits.keepalive_timeout_s
        self._idle_timer = self._loop.call_at(due, self._idle_check)


def _header_lines(headers: dict[str, str], content_type: str | None) -> bytes:
    """An answer's header lines (Date and framing apart); BadHeaderValue if a name or value would
    carry CR, LF or NUL, or is not latin-1 text. Printable text is safe at a glance; only what
    is not (a tab, say) is looked at closely."""
    lines = []
    if content_type is not None:
        if not content_type.isprintable():
            _check(content_type)
        lines.append(f"Content-Type: {content_type}\r\n")
    for key, value in headers.items():
        if not (key.isprintable() and value.isprintable()):
            _check(key)
            _check(value)
        lines.append(f"{key}: {value}\r\n")
    try:
        return "".join(lines).encode("latin-1")
    except UnicodeEncodeError:
        raise BadHeaderValue("a header is not latin-1 text") from None


def _check(text: str) -> None:
    if "\r" in text or "\n" in text or "\0" in text:
        raise BadHeaderValue("a header name or value holds CR, LF or NUL")


# Host values repeat from request to request: each is judged once; the bound keeps odd clients
# from growing the memo.
_hosts: dict[bytes, bool] = {}


def _host_ok(value: bytes) -> bool:
    verdict = _hosts.get(value)
    if verdict is None:
        verdict = _HOST.fullmatch(value.strip(b" \t")) is not None
        if len(_hosts) < 256:
            _hosts[value] = verdict
    return verdict


def _write_pieces(transport: asyncio.Transport, body: bytes) -> None:
    """The rest of a large body after its first piece, unless the client leaves meanwhile."""
    for start in range(WRITE_PIECE, len(body), WRITE_PIECE):
        if transport.is_closing():
            return
        transport.write(body[start : start + WRITE_PIECE])


def _too_large(limit: int) -> Refused:
    return Refused(413, f"Payload too large: the limit is {limit} bytes")


def _reason(exc: Exception) -> str:
    """httptools wraps llhttp's reason (e.g. 'Duplicate Content-Length'); name it plainly."""
    text = str(exc).strip() or type(exc).__name__
    return text.rstrip(".")


def _path(url: bytes) -> str:
    try:
        path = httptools.parse_url(url).path or b"/"
    except httptools.HttpParserInvalidURLError:
        raise Refused(400, "Bad request: the request target is not a URL") from None
    text = path.decode("latin-1")
    return unquote(text) if "%" in text else text


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        line = f"HTTP/1.1 {status} {phrase}\r\n".encode("latin-1")
    return line


_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}

# The Date header (RFC 9110 6.6.1), formatted once a second rather than once an answer.
_date_second = 0
_date_value = b""


def _date() -> bytes:
    global _date_second, _date_value
    now = int(time.time())
    if now != _date_second:
        _date_second = now
        _date_value = formatdate(now, usegmt=True).encode("ascii")
    return _date_value


def _task(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task[None]:
    return loop.create_task(coro)


def _eager_task(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task[None]:
    # From 3.12 a task can run its first step at once, saving a trip round the loop per
    # request, as aiohttp's server does there; before that, the ordinary way.
    if sys.version_info >= (3, 12):
        return asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg,unused-ignore]
    return loop.create_task(coro)
