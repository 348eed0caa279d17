"""One client's listen stream: the acknowledgement, then what is owed to it, then its end.

What is owed is coalesced per subject (a task, a list, a resource): a client that reads slowly
gets the latest snapshot of each task rather than every one in between, so what a stream holds
is bounded by what it watches, never by how fast things change (docs/operations.md, "Memory").
What all streams of a process owe together is bounded too (PendingBudget): past the bound, the
stream owing the most is cut, as a proxy cuts a slow consumer; its client listens again and
gets the current state (tasks live on the backends, their routes in the store).
Every event carries `_meta["io.modelcontextprotocol/subscriptionId"]`, the listen request's id
as the client sent it (same JSON type): the core, basic/patterns/subscriptions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson

from gateway.catalog.discovery import SERVER_INFO
from gateway.h1.request import Stream
from gateway.protocol.codes import RequestId
from gateway.protocol.meta import SERVER_INFO_KEY
from gateway.protocol.sse import encode_event

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
TASK_NOTIFICATION = "notifications/tasks"
KEEPALIVE = b": keepalive\n\n"  # an SSE comment: clients ignore it, proxies see traffic

log = logging.getLogger("taskgate.listen")


class PendingBudget:
    """Event bytes owed to clients over all the streams of one kind in a process: counted as
    an event is owed, let go when it is replaced, written (once the client's socket took it)
    or its stream ends. Past `limit`, the stream owing the most is cut (see ListenStream.cut):
    counting is O(1) per event; a cut looks once at the streams that owe something."""

    __slots__ = ("cuts", "held", "limit", "owing", "setting")

    def __init__(self, limit: int, setting: str) -> None:
        self.limit = limit
        self.setting = setting  # the setting named in the warning of a cut
        self.held = 0
        self.cuts = 0  # streams cut since the process started
        self.owing: set[ListenStream] = set()  # the streams that owe bytes now, and may be cut

    def owe(self, listener: ListenStream, change: int) -> None:
        self.held += change
        if listener.owed_bytes:
            self.owing.add(listener)
        else:
            self.owing.discard(listener)
        while self.held > self.limit and self.owing:
            most = max(self.owing, key=_owed)
            log.warning(
                "a stream owing its client %d bytes was cut: %s (%d) reached",
                most.owed_bytes,
                self.setting,
                self.limit,
            )
            self.cuts += 1
            most.cut()

    def let_go(self, listener: ListenStream) -> None:
        self.held -= listener.owed_bytes
        listener.owed_bytes = 0
        self.owing.discard(listener)


def _owed(listener: ListenStream) -> int:
    return listener.owed_bytes


class ListenStream:
    """The events one stream still has to send, and the loop that sends them."""

    __slots__ = (
        "_budget",
        "_closed",
        "_cutter",
        "_ending",
        "_pending",
        "_wake",
        "owed_bytes",
        "principal",
        "subscription_id",
        "tenant",
    )

    def __init__(
        self, subscription_id: RequestId, tenant: str, principal: str, budget: PendingBudget
    ) -> None:
        self.subscription_id = subscription_id
        self.tenant = tenant
        self.principal = principal
        self._budget = budget
        self._pending: dict[tuple[str, str], bytes] = {}
        self.owed_bytes = 0  # the pending events' bytes and the batch being written
        self._wake = asyncio.Event()
        self._ending = False
        self._closed = False  # cut, or its stream ended: nothing more is owed or counted
        self._cutter: Callable[[], None] | None = None  # closes its connection, while it runs

    def notification(self, method: str, params: dict[str, Any] | None = None) -> bytes:
        """One notification of this stream as an SSE event, tagged with its subscription id."""
        meta = {SUBSCRIPTION_ID: self.subscription_id}
        body = {"jsonrpc": "2.0", "method": method, "params": {**(params or {}), "_meta": meta}}
        return encode_event(orjson.dumps(body).decode(), event="message")

    def push(self, subject: tuple[str, str], event: bytes) -> None:
        """Owe `event` for `subject`, replacing what was owed for it and not yet sent."""
        if self._closed:
            return
        replaced = self._pending.pop(subject, None)  # re-inserted last: in order of change
        self._pending[subject] = event
        self._wake.set()
        change = len(event) - (len(replaced) if replaced is not None else 0)
        self.owed_bytes += change
        self._budget.owe(self, change)

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

    def cut(self) -> None:
        """End the stream at once, owing nothing: the budget is spent and this stream owes the
        most. Its connection closes after what was sent (no listen result: the client cannot
        take it, and the stream must not look complete), and run() returns."""
        self.close()
        self._wake.set()
        if self._cutter is not None:
            self._cutter()

    def close(self) -> None:
        """The stream ended or was cut: what it owes is let go, and nothing more is owed."""
        self._closed = True
        self._pending.clear()
        self._budget.let_go(self)

    async def run(
        self, stream: Stream, acknowledgement: bytes, keepalive_s: float, cut: Callable[[], None]
    ) -> None:
        """Send the acknowledgement, then every owed event as it comes, until end() (the
        graceful result goes last), cut() (`cut` closes the connection), or until the client
        leaves (ConnectionResetError, or the handler cancelled with its connection)."""
        if self._closed:
            cut()  # cut before its stream began
            return
        self._cutter = cut
        try:
            await self._send(stream, acknowledgement, keepalive_s)
        finally:
            self._cutter = None
            self.close()

    async def _send(self, stream: Stream, acknowledgement: bytes, keepalive_s: float) -> None:
        await stream.write(acknowledgement)
        while not self._closed:
            if not self._pending and not self._ending:
                try:
                    async with asyncio.timeout(keepalive_s):
                        await self._wake.wait()
                except TimeoutError:
                    await stream.write(KEEPALIVE)
                    continue
            self._wake.clear()
            if self._closed:
                return
            if self._pending:
                batch = b"".join(self._pending.values())
                self._pending.clear()
                # Counted until the client's socket took it (write returns below its high-water
                # mark): a client that does not read keeps it owed, and may be cut for it.
                await stream.write(batch)
                if self._closed:
                    return
                self.owed_bytes -= len(batch)
                self._budget.owe(self, -len(batch))
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
