"""One client connection's writing side: its transport, write flow control, the answer account
and the request bytes it holds against its server's budget. A request and its answer write
through it (gateway/h1/request.py); the rest of the connection is built on it
(gateway/h1/server.py, HTTPConnection)."""

from __future__ import annotations

import asyncio
from typing import Final

from gateway.h1.answers import AnswerAccount, AnswerBudget
from gateway.h1.limits import Limits, RequestBytes
from gateway.h1.wire import header_lines, http_date, status_line

# The connection's life (`_life`), one value that only moves forward (`_end`):
#
#   OPEN     reads and answers requests.
#   CLOSING  takes no new request (only the body of the one in hand), answers those in hand,
#            then closes: its last request, an Upgrade, the server's drain.
#   BROKEN   parses nothing more (bytes that cannot be framed, a refusal, a read timeout, an
#            Upgrade's end); what is due is still answered, then it closes.
OPEN: Final = 0
CLOSING: Final = 1
BROKEN: Final = 2

# Where the answer to the active request is (`_answer`): a second value, not more states of the
# life above, since with pipelining the two move apart (one request is answered while the
# connection reads the next, is closing, or is broken by the bytes that follow).
#
#   IDLE       no request is active
#   STARTING   one became active; its handler starts once the bytes in hand are parsed
#   SERVING    its handler runs
#   STREAMING  the head of its streamed answer is on the wire
IDLE: Final = 0
STARTING: Final = 1
SERVING: Final = 2
STREAMING: Final = 3


class Link(asyncio.Protocol):
    """The writing side of one client connection, and the base of HTTPConnection."""

    def __init__(self, limits: Limits, budget: RequestBytes) -> None:
        self._limits = limits
        self._budget = budget  # the server's, shared by all of its connections
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._life = OPEN
        self._answer = IDLE
        # Answer bytes held for this client, against the process's budget (Server.answers).
        self._account: AnswerAccount | None = None
        # What the handler keeps for this connection from one request to the next
        # (DownstreamRequest.remember): the verified caller of the token it sends each time.
        self._memo: object = None

    def _end(self, life: int) -> None:
        """Move the connection's life on to `life`, never back."""
        if life > self._life:
            self._life = life

    def _winding_up(self) -> bool:
        """Whether the connection ends after the answer being written, whatever its request
        asked: the server drains, or the connection closes with no request waiting. Known to
        the connection, which holds the requests (HTTPConnection)."""
        raise NotImplementedError

    # -- answers --------------------------------------------------------------------------------

    def stream_lines(self, headers: dict[str, str]) -> bytes:
        """The header lines of a streamed answer's head, before anything of it is written:
        ConnectionResetError once the client has gone, BadHeaderValue for a header that must
        not be written."""
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        return header_lines(headers, None)

    def open_stream(self, status: int, lines: bytes, framing: bytes) -> None:
        """Write a streamed answer's head: its status line, Date, `lines`, then `framing` (the
        lines that say how its body ends, and the blank line)."""
        transport = self._transport
        if transport is None:
            raise ConnectionResetError("the client closed the connection")
        head = (status_line(status), b"Date: ", http_date(), b"\r\n", lines, framing)
        transport.write(b"".join(head))
        self._answer = STREAMING

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
        budget = self._budget
        if budget.held + size > budget.most:
            return False
        budget.held += size
        return True

    def _let_go(self, size: int) -> None:
        self._budget.held -= size

    # -- ending ---------------------------------------------------------------------------------

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
