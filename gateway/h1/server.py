"""The public listener's HTTP/1.1 server: llhttp (httptools) parses, gateway/h1 frames; this
module is its Server and the connections' asyncio events.

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

A connection is one object built in layers, each a module of one job: link.py, its writing
side (transport, write flow control, the answer account, the request-bytes budget);
answering.py, the requests in hand and their answers in order, refusals, read timeouts and
when reading goes on; intake.py, the parsing and llhttp's callbacks; here, asyncio's events,
the handlers' tasks and the idle timeout. Beside them: request.py (a request and the answers
to it), limits.py (the bounds), headers.py (a request's header values), wire.py (the bytes of
HTTP/1.1 written and judged).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import cast

from gateway.h1.answers import AnswerBudget
from gateway.h1.intake import Intake
from gateway.h1.limits import WRITE_HIGH_WATER, WRITE_LOW_WATER, Limits, RequestBytes
from gateway.h1.link import BROKEN, IDLE, OPEN, SERVING, STARTING, STREAMING
from gateway.h1.request import DownstreamRequest, DownstreamResponse, Handler, Refusal
from gateway.h1.wire import HEAD_END, eager_task, later_task

log = logging.getLogger("taskgate.listener")


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
        self.request_bytes = RequestBytes(limits.max_buffered_bytes)
        self._all_closed: asyncio.Event | None = None

    @property
    def buffered(self) -> int:
        """Request bytes held over all connections: bodies read and pipelined bytes waiting."""
        return self.request_bytes.held

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


class HTTPConnection(Intake):
    """One client connection: parses requests, runs their handler in order, writes answers.
    Here, asyncio's events, the handlers' tasks and the idle timeout; the parsing below it
    (Intake), the requests in hand and their answers (Answering), the writing side (Link)."""

    def __init__(self, server: Server) -> None:
        super().__init__(server.limits, server.request_bytes, server.refusal)
        self._server = server
        self._task: asyncio.Task[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_answer = 0.0

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
            self._end(BROKEN)
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
            and self._life == OPEN
            and self._raw_body is None
        ):
            # Most reads bring one new request (at most one head): fed whole, at once.
            first = data.find(HEAD_END)
            if first < 0 or data.find(HEAD_END, first + 4) < 0:
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
            self._consume(data)
            self._consumed(True)

    def _consumed(self, eager: bool) -> None:
        """What follows parsing: the read timeout of a request still arriving, the start of
        the handler of one that became the active one, and reading on or paused."""
        if self._parsing is not None:
            self._arm(self._parsing)
        if self._answer == STARTING:
            # The body that came with the head is parsed by now: the handler reads it
            # without waiting.
            self._answer = SERVING
            assert self._active is not None
            # Each called by name (a function held in a variable is called through Python's
            # machinery, compiled or not).
            if eager:
                self._task = eager_task(self._loop, self._serve(self._active))
            else:
                self._task = later_task(self._loop, self._serve(self._active))
        if (
            self._read_paused
            or self._queue
            or self._stash
            or self._life != OPEN
            or self._write_paused
        ):
            self._update_reading()  # otherwise reading goes on, as it is

    def eof_received(self) -> bool:
        # A client that ends its side has gone, as aiohttp's server took it: the transport
        # closes, connection_lost cancels the handler and with it the upstream call. Keeping
        # half-closed connections open would let a client that left hold a backend's work.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(BROKEN)
        self._transport = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self._resting is not None:
            self._resting.cancel()
            self._resting = None
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
        if (
            self._active is None
            and self._queue
            and self._transport is not None
            and self._resting is None
        ):
            self._advance()
        else:
            self._update_reading()

    # -- the handlers, one at a time ------------------------------------------------------------

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
            if self._answer == STREAMING:
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
        self._answer = IDLE
        if self._transport is None or self._transport.is_closing():
            return  # cut, or closed by a refusal: nothing more is served here
        if not (answered.keep_alive and answered.body_complete):
            # Answered before its body ended: the bytes that follow cannot be framed safely.
            self._close()
        elif answered.pause_s > 0.0:
            # The client was told to wait: what it sends meanwhile waits in its socket, unread
            # and costing nothing here, rather than being refused again and again.
            self._last_answer = self._loop.time()
            self._resting = self._loop.call_later(answered.pause_s, self._rested)
            self._update_reading()
        else:
            self._go_on()

    def _rested(self) -> None:
        self._resting = None
        if self._transport is not None and not self._transport.is_closing():
            self._go_on()

    def _go_on(self) -> None:
        """After an answer (or a rest): the next pipelined request, or reading on."""
        if self._queue:
            if not self._write_paused:
                self._advance()
            else:  # the client is not reading: resume_writing starts the next one
                self._last_answer = self._loop.time()
        elif self._life != OPEN:
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
        self._answer = STARTING
        stash, self._stash = self._stash, b""
        if stash:
            self._let_go(len(stash))
        self._consume(stash)
        self._consumed(False)

    # -- ending ---------------------------------------------------------------------------------

    def _winding_up(self) -> bool:
        return self._server.draining or (self._life != OPEN and not self._queue)

    def _idle_check(self) -> None:
        """One timer per connection, moved on when it fires rather than at every answer."""
        busy = self._active is not None or self._parsing is not None or self._resting is not None
        due = self._last_answer + self._limits.keepalive_timeout_s
        if not busy and self._loop.time() >= due:
            self._idle_timer = None
            self._close()
            return
        if busy:
            due = self._loop.time() + self._limits.keepalive_timeout_s
        self._idle_timer = self._loop.call_at(due, self._idle_check)
