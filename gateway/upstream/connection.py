"""One persistent HTTP/1.1 connection to a replica: one exchange at a time, the answer parsed by
llhttp (httptools), its body read whole or streamed with back-pressure (backlog.py).

Why not aiohttp's client: on the relay's hot path it cost more CPU per request than all of
taskgate's checks together (docs/performance.md). This does only what the relay needs: a POST
whose head is bytes built once, an answer with Content-Length, chunked or close-delimited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, cast

import httptools

from gateway.h1.answers import AnswerAccount
from gateway.upstream.backlog import Backlog
from gateway.upstream.deadline import Deadline
from gateway.upstream.framing import (
    Broken,
    DeadlineExceeded,
    ExchangeError,
    HeadBounds,
    HeadLimits,
    Malformed,
    TooLarge,
    header_value,
)

# An exchange's life on one connection (Connection._state), one value:
#
#   IDLE  -- exchange(): the request is written --> SENT
#   SENT  -- a byte of the answer arrives --> HEAD (interim answers, 1xx, stay in HEAD)
#   HEAD  -- the final head; its body's end is in its framing (Content-Length, chunked) --> BODY
#   HEAD  -- the final head; its body ends with the connection --> UNTIL_CLOSE
#   BODY  -- the body's last byte --> COMPLETE;  UNTIL_CLOSE -- the replica closes --> COMPLETE
#   any   -- read to its end, or given up (Connection._finish, abandon) --> IDLE
#
# Apart from it, as they are not steps of that life: `closed` (the socket may close in any
# step, and the caller still holds the exchange until it lets go), `_error` (a failure may
# strike in any step, and the step still says what arrived: an answer complete before its
# deadline passed is whole), `_keep_alive` (what the head said of the connection), and in the
# Backlog how the caller reads the body (`bounded`) and the two reasons reading pauses.
IDLE: Final = 0
SENT: Final = 1
HEAD: Final = 2
BODY: Final = 3
UNTIL_CLOSE: Final = 4
COMPLETE: Final = 5


class UpstreamResponse:
    """The head of a replica's answer, and its body to read whole or in chunks, once."""

    __slots__ = ("_conn", "_exchange", "headers", "status")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], conn: Connection):
        self.status = status
        self.headers = headers  # names lower-cased, in the order received
        self._conn = conn
        self._exchange = conn.exchanges  # which of the connection's exchanges it answers

    def header(self, name: bytes) -> str | None:
        """The first value of a header (`name` lower-case), decoded as latin-1, or None."""
        return header_value(self.headers, name)

    @property
    def buffered(self) -> int:
        """Bytes of the body received and not yet consumed (about HIGH_WATER at most)."""
        return self._conn.buffered

    async def read(self, limit: int) -> bytes:
        """The whole body, at most `limit` bytes (else TooLarge); then the connection is free."""
        return await self._conn.read_body(limit)

    def chunks(self) -> BodyChunks:
        """The body as it arrives; the connection goes back to its pool at its end."""
        return BodyChunks(self._conn)

    def charge(self, account: AnswerAccount) -> None:
        """Count the body's bytes, received and to come, against a client connection's account
        of the answer budget (h1/answers.py, which may pause reading); let go as relayed."""
        self._conn.charge(account)

    def rearm(self, deadline: float | None) -> None:
        """Move the exchange's deadline (None: none): a held 2025-era call (bridge/rounds.py)."""
        if self._conn.exchanges == self._exchange:
            self._conn.rearm(deadline)

    def close(self) -> None:
        """Give up on the rest of the answer: the connection is closed (the replica sees it);
        harmless once it was read to its end, even if the connection carries another now."""
        if self._conn.exchanges == self._exchange:
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
                    conn._finish()
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
        self._bounds = HeadBounds(limits)
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._deadline = Deadline(loop, self._expire)  # one timer for successive exchanges
        self.exchanges = 0  # exchanges begun: an answer acts on its own one only
        self._backlog = Backlog()
        self._reset()

    @property
    def buffered(self) -> int:
        return self._backlog.size

    def _reset(self) -> None:
        self._backlog.reset()
        self._state = IDLE
        self._head: asyncio.Future[UpstreamResponse] | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._bounds.reset()
        self._keep_alive = False
        self._error: ExchangeError | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- the exchange, driven by the caller --------------------------------------------------

    async def exchange(self, data: bytes, deadline: float | None) -> UpstreamResponse:
        """Send one request (head and body, already framed) and wait for the answer's head.
        `deadline` (loop time) bounds the whole exchange, body included: past it, whatever
        waits on this connection gets DeadlineExceeded and the connection closes; one timer
        per exchange, cheaper than a timeout around each await. None: it ends when its caller
        lets go (an upstream listen, which lasts)."""
        if self._transport is None or self.closed:
            raise Broken("the connection is closed", answered=False)
        self._reset()
        self.exchanges += 1
        self._state = SENT
        self._head = self._loop.create_future()
        self.rearm(deadline)
        self._transport.write(data)
        try:
            return await self._head
        except BaseException:
            self.abandon()
            raise

    async def read_body(self, limit: int) -> bytes:
        # Read whole (the answer budget, when charged, bounds what all answers read whole hold
        # together).
        backlog = self._backlog
        backlog.unbound()
        try:
            while self._state != COMPLETE:
                if backlog.size > limit:
                    raise TooLarge(f"the answer is larger than {limit} bytes")
                await self.wait()
            if backlog.size > limit:
                raise TooLarge(f"the answer is larger than {limit} bytes")
        except BaseException:
            self.abandon()
            raise
        body = b"".join(backlog.chunks)
        self._finish()
        return body

    def take_chunk(self) -> bytes | None:
        """The next chunk received, or None; reading resumes once the backlog is low."""
        return self._backlog.take()

    def charge(self, account: AnswerAccount) -> None:
        self._backlog.charge(account)

    @property
    def complete(self) -> bool:
        return self._state == COMPLETE

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
        if failed is not None and not self._backlog.chunks and self._state != COMPLETE:
            raise failed

    def _failure(self) -> BaseException | None:
        return self._error

    def _finish(self) -> None:
        """The answer was read to its end: back to the pool, or closed if it can't be reused."""
        if self._state == IDLE:
            return
        self._state = IDLE
        self._deadline.clear()
        self._let_go()
        if self._keep_alive and not self.closed:
            self._release(self)
        else:
            self.close()

    def rearm(self, deadline: float | None) -> None:
        if deadline is None or self._state == IDLE:
            self._deadline.clear()
        else:
            self._deadline.set(deadline)

    def abandon(self) -> None:
        if self._state != IDLE:
            self._state = IDLE
            self._deadline.clear()
            self._let_go()
            self.close()

    def _let_go(self) -> None:
        """Drop what is buffered of the answer now: an idle pooled connection, or an exception
        whose traceback reaches this connection, must not keep an answer alive."""
        self._backlog.clear()
        self._headers = []

    def close(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.close()
        self.closed = True
        self._backlog.transport = None
        self._deadline.stop()  # a closed connection holds no timer (nor the timer, it)

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP transport (uvloop's are not asyncio.Transport subclasses, hence no isinstance).
        self._transport = self._backlog.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        state = self._state
        if state == IDLE:
            self.close()  # bytes nobody asked for: this connection can't be trusted again
            return
        if state == SENT:
            self._state = HEAD  # the answer has begun
        backlog = self._backlog
        received = backlog.received
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
        state = self._state
        if state == HEAD:
            over = self._bounds.head_fed(len(data))
        elif state != COMPLETE:
            over = self._bounds.body_fed(len(data), backlog.received > received)
        else:
            return
        if over is not None:
            self._fail(over)

    def eof_received(self) -> bool:
        return False  # the transport closes itself; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._backlog.transport = None
        state = self._state
        if state != IDLE and state != COMPLETE:
            if state == UNTIL_CLOSE and exc is None and self._error is None:
                # A body without framing ends with the connection, unless taskgate closed it
                # (a deadline, a parse error): then what came is not the whole answer.
                self.on_message_complete()
            else:
                how = type(exc).__name__ if exc is not None else "closed"
                answered = state != SENT
                self._fail(Broken(f"the connection {how} mid-answer", answered=answered))
        self._deadline.stop()  # nothing more can arrive: no deadline to keep
        self._release(self)  # the pool forgets it if it was idle

    # -- httptools callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._state == COMPLETE:
            # A second answer to one request: the replica is confused; this one is kept
            # (it was complete), the connection is not.
            raise Malformed("the replica answered more than it was asked")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._state >= BODY:
            # A trailer: llhttp hands it over as a header. Not part of the head the caller
            # read (a replica must not add Retry-After after the fact); bounded like one.
            self._bounds.trailer(name, value)
            return
        headers = self._headers
        self._bounds.header(name, value, len(headers))
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
        sized = any(k in (b"content-length", b"transfer-encoding") for k, _ in self._headers)
        self._state = BODY if sized else UNTIL_CLOSE
        if self._head is not None and not self._head.done():
            self._head.set_result(UpstreamResponse(status, self._headers, self))

    def on_body(self, body: bytes) -> None:
        if self._state < BODY:
            # Found by the fuzzer: the body of an interim answer was taken for the start of
            # the final answer's body.
            raise Malformed("an interim answer of the replica has a body")
        self._backlog.add(body)
        self._wake()

    def on_message_complete(self) -> None:
        if self._state < BODY:
            return  # the end of an interim answer
        self._state = COMPLETE
        self._wake()

    # -- internals ----------------------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _expire(self) -> None:
        self._fail(DeadlineExceeded("no complete answer before the deadline"))

    def _fail(self, error: ExchangeError) -> None:
        if self._error is None:  # the first cause is the one to report (closing follows it)
            self._error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        self._wake()
        if not self.closed:
            self.close()
