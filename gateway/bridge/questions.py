"""The GET stream of a caller's session while its calls run, for the questions a 2025-era
server asks there rather than on the call's own stream.

The TypeScript SDK 1.x sends a request it makes without a related request (its own examples'
`server.elicitInput(...)` in a tool) on the session's GET stream, and drops it when no GET
stream is open: the tool then waits for an answer that never comes, and the call for its
deadline. So while a call from a caller that declared a capability a server may ask about
(elicitation, sampling, roots) runs in its session, taskgate holds that session's GET stream
open, opened before the call is sent, and declines each question there as one on the call's
own stream is declined (gateway/bridge/calls.py). Nothing else on the stream is a call's:
it is dropped. A server that offers no GET stream (405) or holds one already (409) costs
one refused GET.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import orjson

from gateway.bridge.own_session import Opened, declined
from gateway.protocol.sse import FrameTooLarge, SSEDecoder
from gateway.upstream.connection import UpstreamResponse
from gateway.upstream.framing import ConnectFailed, ExchangeError
from gateway.upstream.pool import Pool
from gateway.upstream.relay import MAX_EVENT_BYTES, header_lines
from gateway.upstream.replicas import Replica

log = logging.getLogger("taskgate.bridge")

# The question each client capability allows a 2025 server to ask during a call.
QUESTIONS = {
    "elicitation": "elicitation/create",
    "sampling": "sampling/createMessage",
    "roots": "roots/list",
}
ASKED_ABOUT = tuple(QUESTIONS)


class SessionStream:
    """One session's GET stream, read in the background until stopped; `answer` POSTs a
    decline on the session (CallerSessions.post_later)."""

    def __init__(
        self,
        pool: Pool,
        replica: Replica,
        opened: Opened,
        headers: dict[str, str],
        answer: Callable[[bytes], None],
    ) -> None:
        self._pool = pool
        self._replica = replica
        self._opened = opened
        self._headers = headers
        self._answer = answer
        self._task: asyncio.Task[None] | None = None

    async def open(self, timeout_s: float) -> None:
        """Open the stream and wait for its head (the server holds it from then on); then read
        it in the background. A stream that cannot be opened is logged and left."""
        headers = {**self._headers, **self._opened.headers, "Accept": "text/event-stream"}
        sent = header_lines(headers)
        try:
            # The head within timeout_s; the stream itself has no deadline (stop() ends it).
            async with asyncio.timeout(timeout_s):
                response = await self._pool.bodiless(b"GET", self._replica.url, sent, deadline=None)
        except (ConnectFailed, ExchangeError, TimeoutError) as failed:
            log.info("no GET stream on a session at %s: %r", self._replica.label, failed)
            return
        kind = (response.header(b"content-type") or "").partition(";")[0].strip().lower()
        if response.status != 200 or kind != "text/event-stream":
            response.close()
            return
        self._task = asyncio.get_running_loop().create_task(self._read(response))

    def close(self) -> None:
        """Stop reading; the stream's connection is closed (the server sees it go)."""
        if self._task is not None:
            self._task.cancel()

    async def aclose(self) -> None:
        """close(), and wait until the reading has stopped."""
        self.close()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _read(self, response: UpstreamResponse) -> None:
        decoder = SSEDecoder(MAX_EVENT_BYTES)
        try:
            async for chunk in response.chunks():
                for frame in decoder.feed(chunk):
                    if frame.data is not None:
                        self._seen(frame.data.encode())
        except (ExchangeError, FrameTooLarge) as broken:
            log.info("a session's GET stream at %s broke off: %s", self._replica.label, broken)
        finally:
            response.close()

    def _seen(self, data: bytes) -> None:
        try:
            message = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if isinstance(message, dict) and "method" in message and "id" in message:
            self._answer(declined(message))
