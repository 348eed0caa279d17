"""One client's listen stream: the acknowledgement, then what is owed to it, then its end.

What is owed is coalesced per subject (a task, a list, a resource): a client that reads slowly
gets the latest snapshot of each task rather than every one in between, so what a stream holds
is bounded by what it watches, never by how fast things change (docs/operations.md, "Memory").
Every event carries `_meta["io.modelcontextprotocol/subscriptionId"]`, the listen request's id
as the client sent it (same JSON type): the core, basic/patterns/subscriptions.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from gateway.discovery import SERVER_INFO
from gateway.h1.server import Stream
from gateway.protocol.codes import RequestId
from gateway.protocol.meta import SERVER_INFO_KEY
from gateway.protocol.sse import encode_event

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
TASK_NOTIFICATION = "notifications/tasks"
KEEPALIVE = b": keepalive\n\n"  # an SSE comment: clients ignore it, proxies see traffic


class Listener:
    """The events one stream still has to send, and the loop that sends them."""

    __slots__ = ("_ending", "_pending", "_wake", "principal", "subscription_id", "tenant")

    def __init__(self, subscription_id: RequestId, tenant: str, principal: str) -> None:
        self.subscription_id = subscription_id
        self.tenant = tenant
        self.principal = principal
        self._pending: dict[tuple[str, str], bytes] = {}
        self._wake = asyncio.Event()
        self._ending = False

    def notification(self, method: str, params: dict[str, Any] | None = None) -> bytes:
        """One notification of this stream as an SSE event, tagged with its subscription id."""
        meta = {SUBSCRIPTION_ID: self.subscription_id}
        body = {"jsonrpc": "2.0", "method": method, "params": {**(params or {}), "_meta": meta}}
        return encode_event(orjson.dumps(body).decode(), event="message")

    def push(self, subject: tuple[str, str], event: bytes) -> None:
        """Owe `event` for `subject`, replacing what was owed for it and not yet sent."""
        self._pending.pop(subject, None)  # re-inserted last: events go out in order of change
        self._pending[subject] = event
        self._wake.set()

    @property
    def owed(self) -> int:
        """Events owed and not yet sent (a caller that adds unique subjects bounds this)."""
        return len(self._pending)

    def push_task(self, task_id: str, snapshot: dict[str, Any]) -> None:
        self.push(("task", task_id), self.notification(TASK_NOTIFICATION, snapshot))

    def push_list_changed(self, method: str) -> None:
        self.push(("list", method), self.notification(method))

    def end(self) -> None:
        """End the stream gracefully: what is owed, then the listen's result, then close."""
        self._ending = True
        self._wake.set()

    async def run(self, stream: Stream, acknowledgement: bytes, keepalive_s: float) -> None:
        """Send the acknowledgement, then every owed event as it comes, until end() (the
        graceful result goes last) or until the client leaves (ConnectionResetError, or the
        handler cancelled with its connection)."""
        await stream.write(acknowledgement)
        while True:
            if not self._pending and not self._ending:
                try:
                    async with asyncio.timeout(keepalive_s):
                        await self._wake.wait()
                except TimeoutError:
                    await stream.write(KEEPALIVE)
                    continue
            self._wake.clear()
            if self._pending:
                batch = b"".join(self._pending.values())
                self._pending.clear()
                await stream.write(batch)
            if self._ending:
                await stream.write(self._result())
                return

    def _result(self) -> bytes:
        """The graceful end (the core, basic/patterns/subscriptions): the listen's own result,
        naming taskgate in its `_meta` as every result of taskgate's does."""
        body = {
            "jsonrpc": "2.0",
            "id": self.subscription_id,
            "result": {
                "resultType": "complete",
                "_meta": {SUBSCRIPTION_ID: self.subscription_id, SERVER_INFO_KEY: SERVER_INFO},
            },
        }
        return encode_event(orjson.dumps(body).decode(), event="message")
