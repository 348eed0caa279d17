"""A request of a downstream client as its handler sees it (`DownstreamRequest`: its head, a
body read whole, once), and the two answers a handler gives: whole (`DownstreamResponse`) or
streamed (`Stream`). Both are written through the connection's writing side (gateway/h1/link.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from gateway.h1.answers import AnswerAccount, AnswerBudget
from gateway.h1.headers import Headers, header_text
from gateway.h1.limits import OVER_BUDGET, Refused, too_large
from gateway.h1.link import Link


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

    def __init__(self, conn: Link, status: int, *, chunked: bool) -> None:
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
        "pause_s",
        "raw_headers",
    )

    def __init__(self, conn: Link) -> None:
        self._conn = conn
        self.method = ""  # set once the head is parsed
        self.path = ""
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.content_length: int | None = None
        self.keep_alive = True
        self.http10 = False
        # Set by the handler: the connection is not read for this long after the answer (a
        # caller refused for a limit, told when to retry; limits.pause_refused_ms).
        self.pause_s = 0.0
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

    def header_bytes(self, name: bytes) -> list[bytes] | None:
        """A header's values as received (`name` lower-case), undecoded; None when absent."""
        return self._index.get(name)

    def remembered(self) -> object:
        """What the handler kept for this connection at an earlier request (None at first)."""
        return self._conn._memo

    def remember(self, value: object) -> None:
        """Keep `value` for this connection's next requests (it dies with the connection)."""
        self._conn._memo = value

    @property
    def content_type(self) -> str:
        """The media type without parameters, lower-cased; empty when there is none."""
        values = self._index.get(b"content-type")
        return header_text(values[0]).partition(";")[0].strip().lower() if values else ""

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
        return self._joined()

    def arrived(self) -> bytes | None:
        """The whole body if it has arrived whole (as a small one has, with its head): no
        await, no coroutine. None: `read` waits for it, or says what went wrong."""
        if not self._complete or self._error is not None:
            return None
        return self._joined()

    def _joined(self) -> bytes:
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = [body]
        return body

    def answers(self, budget: AnswerBudget) -> AnswerAccount:
        """This connection's account of the process's answer budget, opened at its first
        relayed answer; what the relay reads from a replica for the client is counted there."""
        return self._conn.answer_account(budget)

    def stream(self, status: int, headers: dict[str, str]) -> Stream:
        """Send the head of a streamed answer now; the body follows through the Stream."""
        conn = self._conn
        lines = conn.stream_lines(headers)
        if self.http10:
            # HTTP/1.0 has no chunks: the end of the connection ends the stream.
            self.keep_alive = False
            framing = b"Connection: close\r\n\r\n"
        elif not self._keeps():
            framing = b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
        else:
            framing = b"Transfer-Encoding: chunked\r\n\r\n"
        conn.open_stream(status, lines, framing)
        return Stream(conn, status, chunked=not self.http10)

    def cut(self) -> None:
        """Close the connection after what was sent, without ending the answer: a streamed
        answer that cannot go on must not look complete to the client."""
        self._conn.cut()

    def _keeps(self) -> bool:
        """Whether the connection stays open after this answer; the answer says so if not."""
        keep = self.keep_alive and self._complete and not self._conn._winding_up()
        self.keep_alive = keep
        return keep

    # -- fed by the connection ------------------------------------------------------------------

    def _feed(self, chunk: bytes, limit: int) -> None:
        self._size += len(chunk)
        if self._error is not None:
            return
        if self._size > limit:
            self._drop()
            self._fail(too_large(limit))
        else:
            budget = self._conn._budget
            if budget.held + len(chunk) > budget.most:
                self._drop()
                self._fail(Refused(503, OVER_BUDGET))
            else:  # counted against the server's budget until the request is answered
                budget.held += len(chunk)
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
