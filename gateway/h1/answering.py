"""A client connection's requests in hand: the one being answered, those parsed ahead that wait
their turn, the one still arriving; and what follows from them: answers written in order,
refusals, each request's read timeout, and whether the connection reads on (flow control).
Built on the connection's writing side (gateway/h1/link.py); the parsing is built on this
(gateway/h1/intake.py)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from gateway.h1.headers import BadHeaderValue
from gateway.h1.limits import WRITE_PIECE, Limits, Refused, RequestBytes
from gateway.h1.link import BROKEN, CLOSING, OPEN, Link
from gateway.h1.request import DownstreamRequest, DownstreamResponse, Refusal
from gateway.h1.wire import header_lines, http_date, status_line, write_pieces

log = logging.getLogger("taskgate.listener")


class Answering(Link):
    """The requests of one connection and their answers (the base of Intake)."""

    def __init__(self, limits: Limits, budget: RequestBytes, refusal: Refusal) -> None:
        super().__init__(limits, budget)
        self._refusal = refusal  # the server's (Server.refusal)
        self._parsing: DownstreamRequest | None = None  # the request whose bytes are arriving
        # parsed, waiting for the one being answered
        self._queue: deque[DownstreamRequest] = deque()
        self._active: DownstreamRequest | None = None  # the one whose handler runs
        self._stash = b""  # bytes received, held unparsed while a request waits its turn
        self._read_paused = False
        # Not read until it fires: the last answer asked the client to wait (request.pause_s).
        self._resting: asyncio.TimerHandle | None = None
        # an upgrade request whose body llhttp skips
        self._raw_body: DownstreamRequest | None = None

    def _send(self, request: DownstreamRequest, response: DownstreamResponse) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        try:
            lines = header_lines(response.headers, response.content_type)
        except BadHeaderValue as exc:
            log.error("an answer was not sent: %s", exc)
            response = self._refusal(500, "Internal error")
            lines = header_lines(response.headers, response.content_type)
        body = response.body
        sent = body if request.method != "HEAD" else b""
        whole = len(sent) <= WRITE_PIECE
        transport.write(
            b"".join(
                (
                    status_line(response.status),
                    b"Date: ",
                    http_date(),
                    b"\r\n",
                    lines,
                    b"" if request._keeps() else b"Connection: close\r\n",
                    b"Content-Length: %d\r\n\r\n" % len(body),
                    sent if whole else sent[:WRITE_PIECE],
                )
            )
        )
        if not whole:
            write_pieces(transport, sent)
        account = self._account
        if account is not None:
            account.answered(transport.get_write_buffer_size())

    def _send_refusal(self, status: int, reason: str) -> None:
        """The server's own answer, the last on this connection."""
        request = DownstreamRequest(self)
        request.keep_alive = False
        response = self._refusal(status, reason)
        if status == 503:
            response.headers.setdefault("Retry-After", "1")
        self._send(request, response)

    @property
    def busy(self) -> bool:
        return self._active is not None

    def close_when_idle(self) -> None:
        self._end(CLOSING)
        if self._active is None:
            self._close()
        else:
            self._update_reading()

    def _refuse(self, status: int, reason: str) -> None:
        """The bytes cannot be framed: nothing after them is read. A request whose handler
        runs, or waits its turn, learns it from its body; otherwise the refusal is the answer
        and the last one, or, behind answers still due, the connection ends after them."""
        self._end(BROKEN)
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
            self._end(BROKEN)
            self._update_reading()
        else:
            self._refuse(408, f"Request timeout: the request did not arrive within {timeout:g} s")

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
            and self._life < BROKEN
            and (request is self._raw_body or self._life == OPEN or request is self._active)
        ):
            request._timer = self._loop.call_later(
                self._limits.read_timeout_s, self._expire, request
            )

    def _update_reading(self) -> None:
        """Read while a request is wanted: none waits its turn, nothing is held unparsed, the
        client reads what it is sent, and the connection takes requests (or the one being
        answered still has body to come)."""
        transport = self._transport
        if transport is None:
            return
        wanted = (
            self._life < BROKEN
            and not self._write_paused
            and self._resting is None
            and not self._queue
            and not self._stash
            and (self._life == OPEN or self._awaits_body())
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
        if self._life == BROKEN:
            return False
        if self._life == OPEN:
            return True
        parsing = self._parsing
        return parsing is not None and bool(parsing.method)  # a request in hand, mid-body
