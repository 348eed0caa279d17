"""One upstream listen of taskgate's own, to one replica (a leg of a downstream listen's
upstream listens, gateway/listen/upstream.py): its request, its stream read until it ends or
has nothing left to relay, its acknowledgement, and its reopening.

A pushed task starts, as a polled one does, with its current snapshot: one tasks/get of its
owner once the downstream acknowledgement is decided.

A listen that ends or fails is opened again with backoff, naming what it still relays. Nothing
is replayed, so its new acknowledgement is followed by one resources/updated per URI it covers
(the client is told to read again) and one tasks/get per task id it covers, whose answer is
relayed as that task's fresh snapshot. A task id the new acknowledgement leaves out is one the
owner forgot (an in-memory task store that restarted): nothing more is sent for it, as when a
poller hears "Task not found".
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from gateway.listen.stream import ACKNOWLEDGED, TASK_NOTIFICATION
from gateway.listen.upstream_stream import StreamOwner, listen_stream
from gateway.listen.upstream_wire import (
    LISTEN,
    UPDATED,
    acknowledged_names,
    less_envelope,
    listen_request,
)
from gateway.protocol.codes import Code
from gateway.protocol.headers import NAME as NAME_HEADER
from gateway.protocol.headers import encode_value
from gateway.protocol.meta import TASKS_EXTENSION
from gateway.upstream.calls import UpstreamCallError, UpstreamRPCError, call
from gateway.upstream.replicas import Replica

log = logging.getLogger("taskgate.listen")

_MAX_FRAME_BYTES = 1024 * 1024  # an ack names at most max_resource_uris URIs; an event one
_FIRST_BACKOFF_S = 0.5
_MAX_BACKOFF_S = 30.0


class LegOwner(StreamOwner, Protocol):
    """What a leg takes of every upstream listen of the process (UpstreamListens)."""

    def next_id(self) -> str: ...


class LegRelay(Protocol):
    """What a leg reports to: the upstream listens of its downstream listen (UpstreamListen)."""

    decided: asyncio.Event

    def relays(self, leg: Leg) -> bool: ...

    def updated(self, leg: Leg, params: dict[str, Any]) -> None: ...

    def task_moved(self, leg: Leg, snapshot: dict[str, Any]) -> None: ...


class LegPlan:
    """What one upstream listen will name, while UpstreamListens.subscribe groups them."""

    __slots__ = ("headers", "replica", "task_ids", "task_timeout_s", "uris")

    def __init__(self, replica: Replica, headers: dict[str, str], task_timeout_s: float) -> None:
        self.replica = replica
        self.headers = headers
        self.task_timeout_s = task_timeout_s
        self.uris: list[str] = []
        self.task_ids: list[str] = []


class _Attempt:
    """One request of a leg: its id, whether it reopens the leg, whether it was acknowledged."""

    __slots__ = ("acked", "fresh", "request_id")

    def __init__(self, request_id: str, *, fresh: bool) -> None:
        self.request_id = request_id
        self.fresh = fresh
        self.acked = False


class Leg:
    """One upstream listen, to one replica: the URIs its backend serves, the task ids it owns."""

    __slots__ = (
        "_headers",
        "_owner",
        "_set",
        "acked",
        "acked_tasks",
        "following",
        "latest",
        "replica",
        "resolved",
        "task",
        "task_ids",
        "task_timeout_s",
        "uris",
    )

    def __init__(
        self,
        owner: LegOwner,
        upstream: LegRelay,
        plan: LegPlan,
        uris: tuple[str, ...],
        task_ids: tuple[str, ...],
    ) -> None:
        self._owner = owner
        self._set = upstream
        self.replica = plan.replica
        self.uris = uris
        self.task_ids = task_ids
        self._headers = plan.headers
        self.task_timeout_s = plan.task_timeout_s  # of a fresh tasks/get
        self.acked: frozenset[str] = frozenset()  # the URIs its first acknowledgement named
        self.acked_tasks: frozenset[str] = frozenset()  # and the task ids
        self.following: set[str] = set()  # the task ids it relays: acknowledged, not ended
        self.latest: dict[str, str] = {}  # task id -> lastUpdatedAt of what it relayed last
        self.resolved = asyncio.Event()  # its first listen was acknowledged, or failed
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        await self.attempt(fresh=False)
        self.resolved.set()
        await self._set.decided.wait()
        failures = 0
        while self._set.relays(self):
            failures += 1
            delay = min(_MAX_BACKOFF_S, _FIRST_BACKOFF_S * 2 ** (failures - 1))
            log.info("%s at %s: listening again in %.1f s", LISTEN, self.replica.label, delay)
            await asyncio.sleep(delay)  # the backoff's cadence, not a synchronisation
            started = time.monotonic()
            if await self.attempt(fresh=True) and time.monotonic() - started >= _MAX_BACKOFF_S:
                failures = 0  # it held a while: the next drop starts the backoff over

    async def attempt(self, *, fresh: bool) -> bool:
        """One upstream listen, until it ends or has nothing left to relay; whether it was
        acknowledged. A fresh one (not the first) is followed by one resources/updated per
        URI and one tasks/get per task id it covers."""
        replica = self.replica
        now = _Attempt(self._owner.next_id(), fresh=fresh)
        # the first time every task id it owns; later, those it still follows
        task_ids = [t for t in self.task_ids if not fresh or t in self.following]
        request = listen_request(now.request_id, self.uris, task_ids, self._headers)
        # A task's snapshot carries its result: as large as a tasks/get answer may be.
        max_frame = max(_MAX_FRAME_BYTES, replica.max_answer_bytes if task_ids else 0)

        async def heard(message: dict[str, Any], deadline: asyncio.Timeout) -> bool:
            return await self._heard(message, now, deadline)

        await listen_stream(self._owner, replica, request, now.request_id, max_frame, heard, LISTEN)
        return now.acked

    async def _heard(
        self, message: dict[str, Any], now: _Attempt, deadline: asyncio.Timeout
    ) -> bool:
        """Act on one notification of the listen's stream; whether the listen is over for this
        leg."""
        method = message["method"]
        params = message.get("params")
        if not isinstance(params, dict):
            return False
        if method == ACKNOWLEDGED and not now.acked:
            now.acked = True
            deadline.reschedule(None)  # acknowledged: the stream may last
            await self._acknowledged(params, fresh=now.fresh)
        elif method == UPDATED and now.acked:
            self._set.updated(self, less_envelope(params))
        elif method == TASK_NOTIFICATION and now.acked:
            self._set.task_moved(self, less_envelope(params))
        else:
            return False
        # its tasks ended and it has no URI: nothing to wait for
        return self._set.decided.is_set() and not self._set.relays(self)

    async def _acknowledged(self, params: dict[str, Any], *, fresh: bool) -> None:
        uris, task_ids = acknowledged_names(params)
        if not fresh:
            self.acked = uris.intersection(self.uris)
            self.acked_tasks = task_ids.intersection(self.task_ids)
            self.resolved.set()
            if not self.acked_tasks:
                return
            # Each pushed task starts, as a polled one does, with its current snapshot: once the
            # downstream acknowledgement is decided (it goes first), one tasks/get per task.
            await self._set.decided.wait()
            ids = [t for t in self.task_ids if t in self.following]
            await asyncio.gather(*(self._refresh(task_id) for task_id in ids))
            return
        # Nothing is replayed: whatever changed while this listen was down is told as a change.
        for uri in self.uris:
            if uri in uris:
                self._set.updated(self, {"uri": uri})
        # A task it left out is one the owner forgot: nothing more will come of it.
        self.following.intersection_update(task_ids)
        if self.following:
            ids = [t for t in self.task_ids if t in self.following]
            await asyncio.gather(*(self._refresh(task_id) for task_id in ids))

    async def _refresh(self, task_id: str) -> None:
        """The owner's tasks/get of `task_id`, relayed as the task's fresh snapshot."""
        try:
            result = await call(
                self._owner.pool,
                self.replica,
                "tasks/get",
                {"taskId": task_id},
                timeout_s=self.task_timeout_s,
                capabilities={"extensions": {TASKS_EXTENSION: {}}},
                headers={**self._headers, NAME_HEADER: encode_value(task_id)},
            )
        except UpstreamRPCError as exc:
            if exc.code == Code.INVALID_PARAMS:  # "Task not found": expired or purged
                self.following.discard(task_id)
            else:
                log.warning("a fresh snapshot after %s: %s", LISTEN, exc)
            return
        except UpstreamCallError as failure:
            log.warning("a fresh snapshot after %s: %s", LISTEN, failure)
            return  # its next change still comes over the listen
        if result.get("taskId") == task_id:
            self._set.task_moved(self, less_envelope(result))
