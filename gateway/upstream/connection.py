"""One persistent HTTP/1.1 connection to a replica: one exchange at a time, the answer parsed by
llhttp (httptools), its body read whole or streamed with back-pressure.

Why not aiohttp's client: on the relay's hot path it cost more CPU per request than all of
taskgate's checks together (docs/performance.md). This does only what the relay needs: a POST
whose head is bytes built once, an answer with Content-Length, chunked or close-delimited.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools

from gateway.h1.answers import AnswerAccount

# Streamed bodies (SSE) stop reading from the socket above HIGH and resume below LOW, so a slow
# client holds back the replica instead of filling taskgate's memory.
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024


class ExchangeError(Exception):
    """An exchange failed; the message says how, for the log and the client's error."""


class Unreachable(ExchangeError):
    """No connection could be made: the request certainly never reached the replica."""


class Broken(ExchangeError):
    """The connection closed or failed before the answer ended."""

    def __init__(self, message: str, *, answered: bool) -> None:
        super().__init__(message)
        # Whether any byte of an answer arrived: without one, a request sent on a reused
        # connection may have met the replica closing it while idle.
        self.answered = answered


class DeadlineExceeded(ExchangeError):
    """The exchange's deadline passed before the answer ended."""


class TooLarge(ExchangeError):
    """An answer read whole grew past the caller's limit."""


class Malformed(ExchangeError):
    """The answer is not HTTP/1.1 that taskgate can read."""


class HeadTooLarge(Malformed):
    """The answer's head passed its limits (a line's bytes, the field count, or the whole head
    while it never ends): a replica must not make taskgate hold what it pleases."""


@dataclass(frozen=True, slots=True)
class HeadLimits:
    """Bounds of an answer's head; a replica's, by default the listener's own."""

    max_header_bytes: int = 8190
    max_headers: int = 100
    max_head_bytes: int = 64 * 1024

    @property
    def head_bound(self) -> int:
        """All bytes before the final head ends, interim answers included: the whole head,
        or one line if that is larger."""
        return max(self.max_head_bytes, self.max_header_bytes)


class UpstreamResponse:
    """The head of a replica's answer, and its body to read whole or in chunks, once."""

    __slots__ = ("_conn", "headers", "status")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], conn: Connection):
        self.status = status
        self.headers = headers  # names lower-cased, in the order received
        self._conn = conn

    def header(self, name: bytes) -> str | None:
        """The first value of a header (`name` lower-case), decoded as latin-1, or None."""
        for key, value in self.headers:
            if key == name:
                return value.decode("latin-1")
        return None

    @property
    def buffered(self) -> int:
        """Bytes of the body received and not yet consumed (bounded near HIGH_WATER while
        streaming: past it taskgate stops reading from the replica)."""
        return self._conn.buffered

    async def read(self, limit: int) -> bytes:
        """The whole body, at most `limit` bytes (else TooLarge); the connection goes back to
        its pool once it has been read."""
        return await self._conn.read_body(limit)

    def chunks(self) -> BodyChunks:
        """The body as it arrives; the connection goes back to its pool at its end."""
        return self._conn.iter_body()

    def charge(self, account: AnswerAccount) -> None:
        """Count the body's bytes, those received already and each one read from now on,
        against a client connection's account of the answer budget (gateway/h1/answers.py),
        which may pause reading from the replica. The caller lets them go as it relays them."""
        self._conn.charge(account)

    def close(self) -> None:
        """Give up on the rest of the answer: the connection is closed, never reused (the
        replica sees the disconnect). Harmless once the body has been read to its end."""
        self._conn.abandon()


class BodyChunks:
    """An answer's body as it arrives, each chunk once, then the connection back to its pool;
    on a failure or a cancellation, the connection is abandoned. An async iterator class, not
    an async generator: mypyc compiles no async generators."""

    __slots__ = ("_conn", "_done")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._done = False

    def __aiter__(self) -> BodyChunks:
        return self

    async def __anext__(self) -> bytes:
        conn = self._conn
        if self._done:
            raise StopAsyncIteration
        try:
            chunk = conn.take_chunk()
            while chunk is None:
                if conn.complete:
                    self._done = True
                    conn.finish()
                    raise StopAsyncIteration
                await conn.wait()
                chunk = conn.take_chunk()
        except StopAsyncIteration:
            raise
        except BaseException:
            self._done = True
            conn.abandon()
            raise
        return chunk


class Connection(asyncio.Protocol):
    """Protocol and parser callbacks of one connection; the pool owns the connection between
    exchanges, the caller of `exchange` during one."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        release: Callable[[Connection], None],
        limits: HeadLimits,
    ):
        self._loop = loop
        self._release = release
        # Read on every header of every answer: kept as plain attributes.
        self._max_line = limits.max_header_bytes
        self._max_fields = limits.max_headers
        self._head_bound = limits.head_bound
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._timer: asyncio.TimerHandle | None = None
        # Made once: the budget calls it to resume a read it paused, and compares it.
        self._resume_for_budget = self._resume_after_budget
        self._account: AnswerAccount | None = None
        self._starved = False  # reading paused by the answer budget
        self._reset()

    @property
    def buffered(self) -> int:
        return self._buffered

    def _reset(self) -> None:
        self._detach()
        self._active = False
        self._head: asyncio.Future[UpstreamResponse] | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0  # received before the final head ended (interim answers included)
        self._head_size = 0  # header lines parsed so far (interim answers included)
        self._received = 0  # body bytes received in all
        self._idle_bytes = 0  # received since the head ended without a byte of body
        self._answered = False
        self._complete = False
        self._keep_alive = False
        self._sized = False  # Content-Length or chunked: the end of the body is in the framing
        self._body: deque[bytes] = deque()
        self._buffered = 0
        self._bounded = True  # streamed: reading pauses above HIGH_WATER
        self._paused = False
        self._error: ExchangeError | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- the exchange, driven by the caller --------------------------------------------------

    async def exchange(self, data: bytes, deadline: float) -> UpstreamResponse:
        """Send one request (head and body, already framed) and wait for the answer's head.

        `deadline` (loop time) bounds the whole exchange, body included: past it, whatever
        waits on this connection gets DeadlineExceeded and the connection closes. One timer
        handle per exchange, cheaper than a timeout context around each await.
        """
        if self._transport is None or self.closed:
            raise Broken("the connection is closed", answered=False)
        self._reset()
        self._active = True
        self._head = self._loop.create_future()
        self._timer = self._loop.call_at(deadline, self._expire)
        self._transport.write(data)
        try:
            return await self._head
        except BaseException:
            self.abandon()
            raise

    async def read_body(self, limit: int) -> bytes:
        # Read whole: the limit bounds memory instead of back-pressure, which would stall (the
        # answer budget, when charged, bounds what all answers read whole hold together).
        self._bounded = False
        if self._paused and self._transport is not None:
            self._paused = False
            if not self._starved:
                self._transport.resume_reading()
        try:
            while not self._complete:
                if self._buffered > limit:
                    raise TooLarge(f"the answer is larger than {limit} bytes")
                await self.wait()
            if self._buffered > limit:
                raise TooLarge(f"the answer is larger than {limit} bytes")
        except BaseException:
            self.abandon()
            raise
        body = b"".join(self._body)
        self._finish()
        return body

    def iter_body(self) -> BodyChunks:
        return BodyChunks(self)

    def take_chunk(self) -> bytes | None:
        """The next chunk received, or None; reading resumes once the backlog is low."""
        if not self._body:
            return None
        chunk = self._body.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered < LOW_WATER and self._transport:
            self._paused = False
            if not self._starved:
                self._transport.resume_reading()
        return chunk

    def charge(self, account: AnswerAccount) -> None:
        self._account = account
        if self._buffered and not account.read(self._buffered):
            self._starve(account)

    def _starve(self, account: AnswerAccount) -> None:
        """The answer budget says no more for now: stop reading from the replica until it
        calls back (the deadline still runs)."""
        if not self._starved:
            self._starved = True
            if not self._paused and self._transport is not None:
                self._transport.pause_reading()
            account.wait(self._resume_for_budget)

    def _resume_after_budget(self) -> None:
        if self._starved:
            self._starved = False
            if not self._paused and self._transport is not None and not self.closed:
                self._transport.resume_reading()

    def _detach(self) -> None:
        """No more of this answer counts against the budget (what was counted is let go with
        the client's request); a read it paused resumes, for the connection's next answer."""
        account = self._account
        if account is not None:
            self._account = None
            if self._starved:
                account.unwait()
                self._resume_after_budget()

    @property
    def complete(self) -> bool:
        return self._complete

    def finish(self) -> None:
        self._finish()

    async def wait(self) -> None:
        """Until more of the answer arrives, or the connection fails (its error)."""
        failed = self._failure()
        if failed is not None:
            raise failed
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        # Read again, not narrowed: a callback may have set it while this waited (mypyc
        # compiles what mypy narrows, so the attribute is read through a call).
        failed = self._failure()
        if failed is not None and not self._body and not self._complete:
            raise failed

    def _failure(self) -> BaseException | None:
        return self._error

    def _finish(self) -> None:
        """The answer was read to its end: back to the pool, or closed if it can't be reused."""
        if not self._active:
            return
        self._active = False
        self._disarm()
        self._let_go()
        if self._keep_alive and not self.closed:
            self._release(self)
        else:
            self.close()

    def abandon(self) -> None:
        if self._active:
            self._active = False
            self._disarm()
            self._let_go()
            self.close()

    def _let_go(self) -> None:
        """Drop what is buffered of the answer now: an idle pooled connection, or an exception
        whose traceback reaches this connection, must not keep an answer alive."""
        self._detach()
        self._body.clear()
        self._buffered = 0
        self._headers = []

    def close(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.close()
        self.closed = True

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP transport (uvloop's are not asyncio.Transport subclasses, hence no isinstance).
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self._active:
            self.close()  # bytes nobody asked for: this connection can't be trusted again
            return
        self._answered = True
        received = self._received
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(Malformed("the replica switched protocols"))
        except httptools.HttpParserError as exc:
            cause = exc.__context__  # a refusal raised in a callback arrives wrapped
            if isinstance(cause, Malformed):
                self._fail(cause)
            else:
                self._fail(Malformed(f"the answer is not valid HTTP/1.1 ({exc})"))
            return
        head = self._head
        if head is not None and not head.done():
            # httptools gathers a header line whole before handing it over: bound what a
            # replica can make taskgate hold while its head never ends.
            self._head_bytes += len(data)
            if self._head_bytes > self._head_bound:
                limit = self._head_bound
                self._fail(HeadTooLarge(f"the answer's head is larger than {limit} bytes"))
        elif not self._complete:
            # The same for trailers (a chunked body's header lines after its last chunk): bytes
            # that carry no body for longer than a head may be long are not an answer.
            self._idle_bytes = 0 if self._received > received else self._idle_bytes + len(data)
            if self._idle_bytes > self._head_bound:
                limit = self._head_bound
                self._fail(HeadTooLarge(f"the answer sent {limit} bytes that are not its body"))

    def eof_received(self) -> bool:
        return False  # the transport closes itself; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._active and not self._complete:
            head_done = self._head is not None and self._head.done()
            if head_done and not self._sized and exc is None and self._error is None:
                # A body without framing ends with the connection, unless taskgate closed it
                # (a deadline, a parse error): then what came is not the whole answer.
                self.on_message_complete()
            else:
                how = type(exc).__name__ if exc is not None else "closed"
                self._fail(Broken(f"the connection {how} mid-answer", answered=self._answered))
        self._release(self)  # the pool forgets it if it was idle

    # -- httptools callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._complete:
            # A second answer to one request: the replica is confused; this one is kept
            # (it was complete), the connection is not.
            raise Malformed("the replica answered more than it was asked")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head is not None and self._head.done():
            # A trailer: llhttp hands it over as a header. Not part of the head the caller
            # read (a replica must not add Retry-After after the fact); bounded like one.
            self._trailers(name, value)
            return
        line = len(name) + len(value) + 2
        if line > self._max_line:
            raise HeadTooLarge(f"a header line of the answer is over {self._max_line} bytes")
        headers = self._headers
        if len(headers) >= self._max_fields:
            raise HeadTooLarge(f"the answer has more than {self._max_fields} header fields")
        self._head_size += line + 2
        if self._head_size > self._head_bound:
            raise HeadTooLarge(f"the answer's head is larger than {self._head_bound} bytes")
        headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        if status < 100:
            raise Malformed(f"the replica answered status {status}")
        if status < 200:
            # An interim answer (100 Continue, 103): its headers belong to no one. llhttp reads
            # a body for some (104-199) by their framing: on_body refuses it.
            self._headers = []
            return
        self._keep_alive = parser.should_keep_alive()
        self._sized = any(k in (b"content-length", b"transfer-encoding") for k, _ in self._headers)
        if self._head is not None and not self._head.done():
            self._head.set_result(UpstreamResponse(status, self._headers, self))

    def _trailers(self, name: bytes, value: bytes) -> None:
        if len(name) + len(value) + 2 > self._max_line:
            limit = self._max_line
            raise HeadTooLarge(f"a trailer line of the answer is over {limit} bytes")
        self._head_size += len(name) + len(value) + 4
        if self._head_size > self._head_bound:
            limit = self._head_bound
            raise HeadTooLarge(f"the answer's head and trailers are larger than {limit} bytes")

    def on_body(self, body: bytes) -> None:
        if self._head is None or not self._head.done():
            # Found by the fuzzer: the body of an interim answer was taken for the start of
            # the final answer's body.
            raise Malformed("an interim answer of the replica has a body")
        self._body.append(body)
        self._received += len(body)
        self._buffered += len(body)
        if self._bounded and not self._paused and self._buffered > HIGH_WATER and self._transport:
            self._paused = True
            if not self._starved:
                self._transport.pause_reading()
        account = self._account
        if account is not None and not account.read(len(body)):
            self._starve(account)
        self._wake()

    def on_message_complete(self) -> None:
        if self._head is None or not self._head.done():
            return  # the end of an interim answer
        self._complete = True
        self._wake()

    # -- internals ----------------------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _expire(self) -> None:
        self._timer = None
        self._fail(DeadlineExceeded("no complete answer before the deadline"))

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fail(self, error: ExchangeError) -> None:
        if self._error is None:  # the first cause is the one to report (closing follows it)
            self._error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        self._wake()
        if not self.closed:
            self.close()
