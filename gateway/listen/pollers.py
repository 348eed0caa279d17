"""notifications/tasks for backends that cannot push: one poller per task, shared by every
stream of this process that watches it.

A poller asks the owner's `tasks/get` no faster than the task's `pollIntervalMs` (the Tasks
extension asks clients to honour it; taskgate is the client here), floored by
`subscriptions.min_poll_interval_ms`, and hands each watcher the snapshot whenever the task
moved (see _digest: not on `lastUpdatedAt` alone): the tasks/get result as the backend sent
it, less `resultType` and its `_meta` (the extension: the notification carries what tasks/get
"would have returned"). It ends
after a terminal snapshot, when the owner says the task is gone, or when nobody watches.

A poller keeps a 16-byte digest of the last snapshot, never the snapshot (a completed task's
carries its result, as large as the backend's max_answer_bytes): a stream that starts watching
a task already polled gets the snapshot of the next poll, at the task's pace, moved or not.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from typing import Any

import orjson

from gateway.bridge.task_input import TaskGone, TaskInput
from gateway.bridge.tasks import snapshot
from gateway.config import SubscriptionsConfig
from gateway.errors import GatewayError
from gateway.listen.stream import ListenStream
from gateway.protocol.codes import Code
from gateway.protocol.headers import NAME as NAME_HEADER
from gateway.protocol.headers import encode_value
from gateway.protocol.meta import TASKS_EXTENSION
from gateway.protocol.tasks import TERMINAL
from gateway.store.base import TaskRoute
from gateway.upstream.calls import UpstreamCallError, UpstreamRPCError, call
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend, Replica

log = logging.getLogger("taskgate.listen")

_MAX_BACKOFF_S = 30.0
_DROPPED = ("resultType", "_meta")  # result fields that are the answer's, not the task's


class Poller:
    """Polls one task for its watchers."""

    __slots__ = (
        "_asks",
        "_backend",
        "_digest",
        "_joined",
        "_replicas",
        "_route",
        "_settings",
        "task",
        "watchers",
    )

    def __init__(
        self,
        route: TaskRoute,
        backend: Backend,
        replicas: Callable[[], list[Replica]],
        settings: SubscriptionsConfig,
        asks: TaskInput | None = None,
    ) -> None:
        self._route = route
        self._asks = asks  # a 2025-era task's questions (gateway/bridge/task_input.py)
        self._backend = backend
        self._replicas = replicas  # the owner, or any replica when the backend shares tasks
        self._settings = settings
        self.watchers: set[ListenStream] = set()
        self._digest: bytes | None = None  # of the last snapshot handed out
        self._joined: set[ListenStream] = set()  # watchers owed the next snapshot, moved or not
        self.task: asyncio.Task[None] | None = None

    def watch(self, listener: ListenStream) -> None:
        """Add a watcher; a late one gets the next poll's snapshot."""
        self.watchers.add(listener)
        if self._digest is not None:
            self._joined.add(listener)

    def unwatch(self, listener: ListenStream) -> None:
        self.watchers.discard(listener)
        self._joined.discard(listener)

    async def run(self, pool: Pool) -> None:
        route = self._route
        headers = {
            **self._backend.credentials,
            **self._backend.identity(route.tenant, route.principal),
            NAME_HEADER: encode_value(route.task_id),
        }
        failures = 0
        while self.watchers:
            result = await self._get(pool, headers)
            if result is None:
                return  # the owner no longer knows the task
            if isinstance(result, UpstreamCallError):
                failures += 1
                if failures == 1:
                    # Once at once, quietly: a pooled connection the backend closed while idle
                    # fails the first call on it, and says nothing about the replica.
                    continue
                delay = min(_MAX_BACKOFF_S, self._interval_s(None) * 2 ** (failures - 1))
                log.warning("polling task of %s: %s; again in %.1f s", route.backend, result, delay)
                await asyncio.sleep(delay)  # the poll cadence, not a synchronisation
                continue
            failures = 0
            delay = self._take(result)
            # Nothing of the answer lives across the sleep (only its digest):
            # objects that survive a sleep reach the collector's oldest generation, and with
            # thousands of pollers its full passes were half of an idle process's CPU
            # (docs/performance.md, "Listen streams").
            result = None
            if delay is None:
                return
            await asyncio.sleep(delay)

    def _take(self, result: dict[str, Any]) -> float | None:
        """Hand a moved task's snapshot to every watcher; the seconds until the next poll, or
        None after a terminal snapshot."""
        snapshot = {key: value for key, value in result.items() if key not in _DROPPED}
        moved = _digest(snapshot)
        task_id = self._route.task_id
        if moved != self._digest:
            self._digest = moved
            owed = self.watchers
        else:
            owed = self._joined
        for listener in owed:
            listener.push_task(task_id, snapshot)
        if self._joined:
            self._joined.clear()
        if snapshot.get("status") in TERMINAL:
            return None
        return self._interval_s(snapshot.get("pollIntervalMs"))

    async def _get(
        self, pool: Pool, headers: dict[str, str]
    ) -> dict[str, Any] | UpstreamCallError | None:
        """The tasks/get result, the failure to retry, or None when the task is gone."""
        if self._route.session:
            return await self._get_2025(headers)
        replicas = self._replicas()
        if not replicas:
            return None  # its replica left the configuration: nothing will answer for it
        try:
            return await call(
                pool,
                replicas[0],
                "tasks/get",
                {"taskId": self._route.task_id},
                timeout_s=self._backend.task_timeout_s,
                capabilities={"extensions": {TASKS_EXTENSION: {}}},
                headers=headers,
            )
        except UpstreamRPCError as said_no:
            if said_no.code == Code.INVALID_PARAMS:  # "Task not found": expired or purged
                return None
            return said_no
        except UpstreamCallError as failed:
            return failed

    async def _get_2025(self, headers: dict[str, str]) -> dict[str, Any] | UpstreamCallError | None:
        """_get of a 2025-era server's task: in its session, on its own replica
        (gateway/bridge/tasks.py)."""
        route = self._route
        replica = self._backend.replica(route.replica)
        asks = self._asks
        if replica is None or asks is None:
            return None
        try:
            return await snapshot(asks, replica, route, headers, self._backend.task_timeout_s)
        except TaskGone:
            return None
        except GatewayError as failed:
            return UpstreamCallError(failed.message)

    def _interval_s(self, poll_interval_ms: object) -> float:
        settings = self._settings
        wanted = settings.default_poll_interval_ms
        if isinstance(poll_interval_ms, int) and not isinstance(poll_interval_ms, bool):
            wanted = poll_interval_ms
        return max(wanted, settings.min_poll_interval_ms) / 1000


def _digest(snapshot: dict[str, Any]) -> bytes:
    """What says whether the task moved: every field but `lastUpdatedAt`, in 16 bytes.
    FastMCP 4.1.4 stamps that one with the time of each read (fastmcp_tasks, tasks_get), so
    comparing it would emit a snapshot on every poll; a task that changes changes something
    else (status, statusMessage, inputRequests, result, ttlMs)."""
    kept = {key: value for key, value in snapshot.items() if key != "lastUpdatedAt"}
    return hashlib.blake2b(orjson.dumps(kept, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()
