"""Record a created task's route, resolve a task id to its owner.

Steps 7 (route) and 9 (capture) of a request, for tasks, in docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from hmac import compare_digest
from time import perf_counter
from typing import Any

from gateway.auth import Principal
from gateway.bridge.own_session import ask
from gateway.bridge.task_input import TaskInput
from gateway.bridge.tasks import opened_of
from gateway.config import TasksConfig
from gateway.errors import BadGateway, Retryable, StoreUnavailable, TaskNotFound
from gateway.observe.metrics import STORE_BUCKETS, Histogram
from gateway.observe.tracer import Tracer
from gateway.protocol.codes import RequestId
from gateway.protocol.envelope import RPCRequest
from gateway.protocol.headers import NAME as NAME_HEADER
from gateway.protocol.headers import encode_value
from gateway.protocol.meta import TASKS_EXTENSION
from gateway.protocol.tasks import (
    MADE_PREFIX,
    MalformedTask,
    created_task,
    is_made,
    task_snapshot,
    valid_task_id,
)
from gateway.store.base import Recorded, TaskRoute, TaskRouteStore, now_ms
from gateway.store.cache import RouteCache
from gateway.upstream.calls import UpstreamCallError, call
from gateway.upstream.pool import Pool
from gateway.upstream.relay import Inspector
from gateway.upstream.replicas import Replica

log = logging.getLogger("taskgate.tasks")

# What can become of a task route here (the label of taskgate_task_routes_total): recorded; found
# or not_found by a task method (unknown, expired, malformed and other principals' ids are one
# answer, so one count); refused when the id was already owned (conflict) or the store did not
# answer (store_down); owner_lost: the route was sound but its owner no longer knew the task
# (it restarted), answered as a task that does not exist (modern._owner_forgot).
ROUTE_OUTCOMES = ("recorded", "found", "not_found", "conflict", "store_down", "owner_lost")


def _raw(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


def may_use(principal: Principal, tenant: str, subject: str, share_in_tenant: bool) -> bool:
    """Whether `principal` may use a task of `tenant` and `subject`: tenant always; principal
    too unless `task_sharing: tenant`. Both are compared, each in time that does not depend on
    where the names differ (compare_digest, on bytes: a claim may be any Unicode); for task
    routes and the tasks taskgate runs alike."""
    same_tenant = compare_digest(_raw(tenant), _raw(principal.tenant))
    same_subject = compare_digest(_raw(subject), _raw(principal.subject))
    return same_tenant and (same_subject or share_in_tenant)


# A task created, for the limits' quotas (gateway/limits/limiter.py, created): tenant,
# principal, task id, expiry in ms. Set by the process; None: nothing counts tasks.
Counted = Callable[[str, str, str, int], Awaitable[None]]


class TaskRouter:
    """The task-route policy: expiry arithmetic, capture before relay, owner checks."""

    def __init__(
        self,
        store: TaskRouteStore,
        config: TasksConfig,
        pool: Pool,
        *,
        cache_size: int = 10_000,
        sharing: str = "principal",
        cancel_timeout_s: float = 5.0,
        task_input: TaskInput | None = None,
    ) -> None:
        self._share_in_tenant = sharing == "tenant"
        # The questions of 2025-era servers' tasks (gateway/bridge/task_input.py), on the
        # store's connection; None where no 2025-era task is served (unit tests).
        self.task_input = task_input
        self.store = store
        self.cache = RouteCache(cache_size)
        self._config = config
        self._pool = pool
        self._cancel_timeout_s = cancel_timeout_s
        self._cancels: set[asyncio.Task[None]] = set()
        # For /metrics: what became of task routes here, and how long the store took.
        self.outcomes = dict.fromkeys(ROUTE_OUTCOMES, 0)
        self.store_times: dict[str, Histogram] = {}
        # A span per store operation when tracing is on (gateway/process/app.py sets it), else None.
        self.tracer: Tracer | None = None
        self.counted: Counted | None = None

    def reconfigure(self, config: TasksConfig, *, sharing: str) -> None:
        """A reload's new lifetimes and sharing rule; recorded routes and the cache stay."""
        self._config = config
        self._share_in_tenant = sharing == "tenant"

    def expires_at(self, created_at_ms: int, ttl_ms: int | None) -> int:
        lifetime_ms = (
            int(self._config.unlimited_ttl_cap_s * 1000) if ttl_ms is None else ttl_ms
        ) + int(self._config.grace_s * 1000)
        return created_at_ms + lifetime_ms

    def capture(
        self,
        request: RPCRequest,
        replica: Replica,
        principal: Principal,
        upstream_headers: dict[str, str],
    ) -> Inspector:
        """An inspector that records the route of a task this answer creates, before relay."""

        async def inspect(message: Any) -> None:
            try:
                created = created_task(message, request.id)
            except MalformedTask as exc:
                raise BadGateway(
                    f"Bad gateway: backend {replica.backend!r} answered a broken task ({exc})",
                    request_id=request.id,
                ) from None
            if created is None:
                return
            if is_made(created.task_id):
                # taskgate's own namespace: its task methods would never reach this backend
                raise BadGateway(
                    f"Bad gateway: backend {replica.backend!r} returned a task id that begins "
                    f"with {MADE_PREFIX!r}, which taskgate keeps for the tasks it runs",
                    request_id=request.id,
                )
            now = now_ms()
            route = TaskRoute(
                task_id=created.task_id,
                backend=replica.backend,
                replica=replica.url,
                tenant=principal.tenant,
                principal=principal.subject,
                created_at_ms=now,
                ttl_ms=created.ttl_ms,
                expires_at_ms=self.expires_at(now, created.ttl_ms),
            )
            await self.record(route, replica, request.id, upstream_headers)

        return inspect

    async def record(
        self,
        route: TaskRoute,
        replica: Replica,
        request_id: RequestId,
        upstream_headers: dict[str, str],
    ) -> None:
        """Make `route` durable before its task's id is relayed; a route that cannot be written
        is a refused call (its task cancelled, best effort), one another owner holds a 502."""
        started = perf_counter()
        try:
            async with asyncio.timeout(self._config.record_timeout_s):
                outcome = await self.store.record(route)
            self._timed("record", started)
        except (StoreUnavailable, TimeoutError) as exc:
            # Durable before relay: no route, no id. The task itself is cancelled, best effort.
            self.outcomes["store_down"] += 1
            if self.tracer is not None:
                self.tracer.store("record", perf_counter() - started, exc)
            log.error("could not record a task route of %s: %s", replica.label, exc)
            self.cancel_later(replica, route, upstream_headers)
            raise Retryable(
                "The task could not be recorded, so it was cancelled; retry the call",
                request_id=request_id,
            ) from None
        if outcome is Recorded.CONFLICT:
            # Another owner holds this id: relaying it would hand that task to this caller.
            self.outcomes["conflict"] += 1
            log.error("backend %s returned a task id that is already owned", replica.label)
            raise BadGateway(
                f"Bad gateway: backend {replica.backend!r} returned a task id that is already "
                "in use",
                request_id=request_id,
            )
        self.outcomes["recorded"] += 1
        self.cache.put(route)
        if self.counted is not None and outcome is Recorded.INSERTED:  # a retried write: once
            await self.counted(route.tenant, route.principal, route.task_id, route.expires_at_ms)

    async def resolve(self, task_id: Any, principal: Principal, request_id: RequestId) -> TaskRoute:
        """The route of a task the caller owns; every other case is the same TaskNotFound."""
        outcomes = self.outcomes
        if not valid_task_id(task_id):
            raise self._not_found(request_id)
        cached = self.cache.get(principal.tenant, principal.subject, task_id)
        if cached is not None:
            outcomes["found"] += 1
            return cached
        # The store leaves out another owner's route: such an id costs the same read and the
        # same empty reply as an unknown one (decoding a found route is what made it slower).
        owner = None if self._share_in_tenant else principal.subject
        started = perf_counter()
        try:
            route = await self.store.lookup_owned(task_id, principal.tenant, owner)
        except StoreUnavailable as exc:
            outcomes["store_down"] += 1
            if self.tracer is not None:
                self.tracer.store("lookup", perf_counter() - started, exc)
            raise
        self._timed("lookup", started)
        # The same rule once more, on the owner's route only: a store that let another owner's
        # through would still not hand it out.
        if route is None or not self._may_use(principal, route):
            raise self._not_found(request_id)
        outcomes["found"] += 1
        self.cache.put(route)
        return route

    def _not_found(self, request_id: RequestId) -> TaskNotFound:
        """The one answer of every id the caller may not use, whatever the reason: counted and
        built in one place, so that no reason costs more than another here (THREAT_MODEL.md)."""
        self.outcomes["not_found"] += 1
        return TaskNotFound(request_id)

    def _timed(self, operation: str, started: float) -> None:
        seconds = perf_counter() - started
        histogram = self.store_times.get(operation)
        if histogram is None:
            histogram = self.store_times[operation] = Histogram(STORE_BUCKETS)
        histogram.observe(seconds)
        if self.tracer is not None:
            self.tracer.store(operation, seconds)

    def _may_use(self, principal: Principal, route: TaskRoute) -> bool:
        """Only a found route comes here, never the owner's cache hit."""
        return may_use(principal, route.tenant, route.principal, self._share_in_tenant)

    def follow(self, route: TaskRoute, request: RPCRequest) -> Inspector:
        """An inspector that moves the route's expiry when tasks/get reports a new ttlMs."""

        async def inspect(message: Any) -> None:
            snapshot = task_snapshot(message, request.id)
            if snapshot is None or snapshot.ttl_ms == route.ttl_ms:
                return
            expires = self.expires_at(route.created_at_ms, snapshot.ttl_ms)
            started = perf_counter()
            try:
                await self.store.refresh_expiry(route.task_id, snapshot.ttl_ms, expires)
                self._timed("refresh_expiry", started)
                self.cache.moved(route, snapshot.ttl_ms, expires)
            except StoreUnavailable as exc:
                if self.tracer is not None:
                    self.tracer.store("refresh_expiry", perf_counter() - started, exc)
                # The read itself succeeded; the old expiry stands until a later poll.
                log.warning("could not move a task route's expiry: %s", exc)

        return inspect

    def cancel_later(self, replica: Replica, route: TaskRoute, headers: dict[str, str]) -> None:
        """Cancel the task of a route that could not be recorded (best effort): in its session
        when a 2025-era server runs it (gateway/bridge/tasks.py)."""
        task = asyncio.create_task(self._cancel(replica, route, headers))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _cancel(self, replica: Replica, route: TaskRoute, headers: dict[str, str]) -> None:
        task_id = route.task_id
        try:
            if route.session:
                params = {"taskId": task_id}
                opened = opened_of(route.session)
                await ask(
                    self._pool, replica, opened, headers, "tasks/cancel", params,
                    self._cancel_timeout_s,
                )  # fmt: skip
                return
            await call(
                self._pool,
                replica,
                "tasks/cancel",
                {"taskId": task_id},
                timeout_s=self._cancel_timeout_s,
                capabilities={"extensions": {TASKS_EXTENSION: {}}},
                headers={**headers, NAME_HEADER: encode_value(task_id)},
            )
        except UpstreamCallError as exc:
            log.warning("best-effort cancel of an unrecorded task failed: %s", exc)

    async def close(self) -> None:
        """Let pending best-effort cancels finish (each is bounded by its own timeout), and
        stop reading 2025-era tasks' questions."""
        if self.task_input is not None:
            await self.task_input.close()
        if self._cancels:
            await asyncio.gather(*self._cancels, return_exceptions=True)
