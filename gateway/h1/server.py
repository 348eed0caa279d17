"""The public listener's HTTP/1.1 server: llhttp (httptools) parses, this module frames.

Why not aiohttp's server: behind it, taskgate spent more CPU per request in aiohttp's request
and response machinery than in all of its own checks (docs/performance.md, decision 24). This
serves what taskgate's listener needs and no more: requests with a body of bounded size read
whole, answers with Content-Length, and event streams sent chunked with back-pressure.

The rules a public HTTP/1.1 server owes its clients, and where they are kept:

- framing: llhttp in its strict default, so Content-Length together with Transfer-Encoding,
  a repeated Content-Length, bad chunk sizes, bare LF and obs-fold are parse errors (400 and
  close), never a second interpretation of the same bytes;
- limits: one header line (the request line included) and the number of header fields (431),
  and the body (413); a body over the limit is read and dropped, never buffered;
- time: a request must arrive whole within `read_timeout_s` of its first byte (408), and an
  idle keep-alive connection closes after `keepalive_timeout_s`;
- order: pipelined requests are answered in order, one handler at a time per connection;
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
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import httptools

log = logging.getLogger("taskgate.listener")

# Requests parsed ahead of the one being answered, beyond which reading pauses.
PIPELINE_DEPTH = 8


@dataclass(frozen=True, slots=True)
class Limits:
    max_header_bytes: int = 8190
    max_headers: int = 100
    max_body_bytes: int = 4 * 1024 * 1024
    read_timeout_s: float = 10.0
    keepalive_timeout_s: float = 75.0


class Refused(Exception):
    """The server refuses the request with this status; `reason` is for the client."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Response:
    """An answer sent whole, with Content-Length."""

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


Reply = Response | Stream
Handler = Callable[["Request"], Awaitable[Reply]]
# Renders the server's own refusals (400, 408, 413, 414, 431, 500) in the caller's format.
Refusal = Callable[[int, str], Response]


class Request:
    """One parsed request; its body arrives as the handler runs and is read whole, once."""

    __slots__ = (
        "_body",
        "_complete",
        "_conn",
        "_continue",
        "_error",
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
            self._body = []
            self._fail(_too_large(limit))
        else:
            self._body.append(chunk)

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
    """A protocol factory for `loop.create_server`, and the set of its open connections."""

    def __init__(self, handler: Handler, limits: Limits, refusal: Refusal) -> None:
        self.handler = handler
        self.limits = limits
        self.refusal = refusal
        self.connections: set[HTTPConnection] = set()
        self.draining = False
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
        self._limits = server.limits
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._parsing: Request | None = None  # the request whose bytes are arriving
        self._url = b""
        self._head_bytes = 0
        self._queue: deque[Request] = deque()  # parsed, waiting for the one being answered
        self._active: Request | None = None  # the one whose handler runs
        self._starting = False  # _active's handler starts once the bytes in hand are parsed
        self._task: asyncio.Task[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_answer = 0.0
        self._closing = False  # no new request: close once those in hand are answered
        self._read_paused = False
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._streaming = False  # the active answer's head is on the wire
        self._raw_body: Request | None = None  # an upgrade request whose body llhttp skips

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._server.connections.add(self)
        if self._server.draining:
            self.abort()
            return
        self._last_answer = self._loop.time()
        self._idle_timer = self._loop.call_at(
            self._last_answer + self._limits.keepalive_timeout_s, self._idle_check
        )

    def data_received(self, data: bytes) -> None:
        if self._closing:
            if self._raw_body is not None:
                self._feed_raw(data)
            return
        in_head = self._parsing is None or not self._parsing.method
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            # taskgate speaks HTTP/1.1 only: the request is answered, then the connection ends.
            self._closing = True
            if self._raw_body is not None:
                self._feed_raw(data[upgrade.args[0] :])
            else:
                self._pause_reading()
        except httptools.HttpParserError as exc:
            # A limit raised in a callback arrives wrapped by httptools.
            refused = exc.__context__
            if isinstance(refused, Refused):
                self._refuse(refused.status, refused.reason)
            else:
                self._refuse(400, f"Bad request: {_reason(exc)}")
        finally:
            if self._starting:
                # The body that came with the head is parsed by now: the handler reads it
                # without waiting.
                self._starting = False
                assert self._active is not None
                self._task = _eager_task(self._loop, self._serve(self._active))
        parsing = self._parsing
        if parsing is None or self._closing:
            return
        if in_head and not parsing.method:
            # httptools gathers a header line whole before handing it over: bound what a
            # client can make taskgate hold while it never ends one.
            self._head_bytes += len(data)
            if self._head_bytes > self._limits.max_header_bytes * (self._limits.max_headers + 2):
                self._refuse(431, "Request header fields too large")
                return
        if parsing._timer is None and not parsing._complete and parsing._error is None:
            # Only a request split across reads needs a timer: most arrive in one.
            parsing._timer = self._loop.call_later(
                self._limits.read_timeout_s, self._expire, parsing
            )

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
            request._finish()
            self._pause_reading()
        elif request._timer is None and request._error is None:
            request._timer = self._loop.call_later(
                self._limits.read_timeout_s, self._expire, request
            )

    def eof_received(self) -> bool:
        # A client that ends its side has gone, as aiohttp's server took it: the transport
        # closes, connection_lost cancels the handler and with it the upstream call. Keeping
        # half-closed connections open would let a client that left hold a backend's work.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._transport = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        gone = ConnectionResetError("the client closed the connection")
        for request in (self._active, self._parsing, *self._queue):
            if request is not None:
                request._fail(gone)
        self._queue.clear()
        if self._task is not None:
            self._task.cancel()  # the handler's upstream call ends with it
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(gone)
        self._server._closed(self)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # -- httptools callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._parsing = Request(self)
        self._url = b""
        self._head_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self._limits.max_header_bytes:
            raise Refused(414, "URI too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        request = self._parsing
        assert request is not None
        if len(name) + len(value) + 2 > self._limits.max_header_bytes:
            raise Refused(431, "Request header fields too large: a header line is too long")
        if len(request.raw_headers) >= self._limits.max_headers:
            raise Refused(431, "Request header fields too large: too many header fields")
        request.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        request = self._parsing
        assert request is not None
        request.path = _path(self._url)
        request.method = self._parser.get_method().decode("ascii")
        request.keep_alive = self._parser.should_keep_alive()
        request.http10 = self._parser.get_http_version() == "1.0"
        chunked = False
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
            elif lowered == b"expect" and value.strip().lower() == b"100-continue":
                request._continue = not request.http10  # RFC 9110 10.1.1: ignored from 1.0
            elif lowered == b"transfer-encoding":
                chunked = True
        limit = self._limits.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            request._fail(_too_large(limit))
        elif self._parser.should_upgrade() and (chunked or request.content_length):
            # taskgate ignores Upgrade (RFC 9110 7.8 lets it), but llhttp hands the bytes after
            # an upgrade request's head to the new protocol: its body is read here, by its
            # length (curl --http2 sends such requests), and the connection ends after it.
            if chunked:
                reason = "Bad request: taskgate does not switch protocols; send it without Upgrade"
                request._fail(Refused(400, reason))
            else:
                self._raw_body = request
        if self._active is None:
            self._active = request
            self._starting = True
        else:
            self._queue.append(request)
            if len(self._queue) >= PIPELINE_DEPTH:
                self._pause_reading()

    def on_body(self, body: bytes) -> None:
        assert self._parsing is not None
        self._parsing._feed(body, self._limits.max_body_bytes)

    def on_message_complete(self) -> None:
        assert self._parsing is not None
        if self._parsing is not self._raw_body:  # its body is still to come
            self._parsing._finish()
            self._parsing = None

    # -- answering ------------------------------------------------------------------------------

    async def _serve(self, request: Request) -> None:
        try:
            reply = await self._server.handler(request)
        except ConnectionResetError:
            # The client left, or half-closed before its body ended: nothing to answer.
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
        if isinstance(reply, Response):
            self._send(request, reply)
        elif not reply._ended and self._transport is not None and not self._transport.is_closing():
            try:
                await reply.end()
            except ConnectionResetError:
                return
        self._next(request)

    def _next(self, answered: Request) -> None:
        self._active = None
        self._task = None
        self._streaming = False
        if self._transport is None or self._transport.is_closing():
            return  # cut, or closed by a refusal: nothing more is served here
        if not (answered.keep_alive and answered.body_complete):
            # Answered before its body ended: the bytes that follow cannot be framed safely.
            self._close()
        elif self._queue:
            self._active = self._queue.popleft()
            self._task = _eager_task(self._loop, self._serve(self._active))
            if self._read_paused and not self._closing:
                self._read_paused = False
                self._transport.resume_reading()
        elif self._closing:
            self._close()
        else:
            self._last_answer = self._loop.time()

    def _send(self, request: Request, response: Response) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        body = response.body
        head = [_status_line(response.status), b"Date: ", _date(), b"\r\n"]
        if response.content_type is not None:
            head += (b"Content-Type: ", response.content_type.encode("latin-1"), b"\r\n")
        for key, value in response.headers.items():
            head += (key.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n")
        if not self._keeps(request):
            head.append(b"Connection: close\r\n")
        head.append(b"Content-Length: %d\r\n\r\n" % len(body))
        if request.method != "HEAD":
            head.append(body)
        transport.write(b"".join(head))

    def _keeps(self, request: Request) -> bool:
        """Whether the connection stays open after this answer; the answer says so if not."""
        keep = request.keep_alive and request.body_complete
        if keep and (self._server.draining or (self._closing and not self._queue)):
            keep = False
        request.keep_alive = keep
        return keep

    def start_stream(self, request: Request, status: int, headers: dict[str, str]) -> Stream:
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        head = [_status_line(status), b"Date: ", _date(), b"\r\n"]
        for key, value in headers.items():
            head += (key.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n")
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
        if self._write_paused:
            self._drained = self._loop.create_future()
            try:
                await self._drained
            finally:
                self._drained = None

    def send_raw(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    # -- ending ---------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._active is not None

    def close_when_idle(self) -> None:
        self._closing = True
        if self._active is None:
            self._close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def cut(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _refuse(self, status: int, reason: str) -> None:
        """The bytes cannot be framed: nothing after them is read. A request whose handler
        runs, or waits its turn, learns it from its body; otherwise the refusal is the answer,
        and the last one."""
        self._stop_reading()
        parsing = self._parsing
        if parsing is not None and (parsing is self._active or parsing in self._queue):
            parsing._fail(Refused(status, reason))
            return
        if parsing is not None:
            parsing._disarm()
        if self._active is None and not self._queue:
            request = Request(self)
            request.keep_alive = False
            self._send(request, self._server.refusal(status, reason))
            self._close()

    def _stop_reading(self) -> None:
        self._closing = True
        self._pause_reading()

    def _expire(self, request: Request) -> None:
        """The read timeout of `request`, which has not arrived whole."""
        request._timer = None
        timeout = self._limits.read_timeout_s
        if request.method:  # its handler answers 408 when it reads the body
            reason = f"Request timeout: the body did not arrive within {timeout:g} s"
            request._fail(Refused(408, reason))
            self._stop_reading()
        else:
            self._refuse(408, f"Request timeout: the request did not arrive within {timeout:g} s")

    def _pause_reading(self) -> None:
        if not self._read_paused and self._transport is not None:
            self._read_paused = True
            self._transport.pause_reading()

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


def _eager_task(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task[None]:
    # From 3.12 a task can run its first step at once, saving a trip round the loop per
    # request, as aiohttp's server does there; before that, the ordinary way.
    if sys.version_info >= (3, 12):
        return asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg,unused-ignore]
    return loop.create_task(coro)
