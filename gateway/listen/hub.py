"""Every listen stream of this process: admission, what each one is acknowledged, the pollers
and the list watcher they share, and their end.

A listen is opened in two halves. `open` runs inside the request's coordinator slot: it checks
the filter and the limits (taking the stream's place at once), resolves each task id through
the same ownership check as tasks/get, and starts the upstream listens; a refusal is an
ordinary error answer. `serve` runs after the slot is given back (a stream may last for hours,
and a silent backend's acknowledgement may take `subscriptions.ack_timeout_s`; neither may hold
one of `listen.max_in_flight`): it awaits the upstream acknowledgements, decides and sends the
acknowledgement (or still refuses, before any stream starts), then the events, until the client
leaves or taskgate drains.

A task id is pushed when its owning replica acknowledged it on an upstream listen of taskgate's
own (gateway/listen/upstream.py), and polled otherwise (gateway/listen/pollers.py); a task
taskgate runs itself is watched in the store (gateway/listen/made_watch.py). The
acknowledgement names every owned id either way, in the client's order.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from gateway.auth import Principal
from gateway.catalog.capabilities import may_push_tasks
from gateway.catalog.discovery import Catalog
from gateway.catalog.table import RouteTable
from gateway.config import SubscriptionsConfig
from gateway.errors import Retryable, TaskNotFound
from gateway.h1.request import DownstreamRequest, Stream
from gateway.limits.limiter import Limiter
from gateway.limits.streams import StreamCounts
from gateway.listen.filter import TASK_IDS, parse_filter
from gateway.listen.lists import ListWatcher
from gateway.listen.made_watch import MadeWatches
from gateway.listen.pollers import Poller
from gateway.listen.stream import ACKNOWLEDGED, ListenStream, PendingBudget
from gateway.listen.upstream import UpstreamListen, UpstreamListens
from gateway.listen.upstream_wire import RESOURCES
from gateway.protocol.codes import RequestId
from gateway.protocol.envelope import RPCRequest
from gateway.protocol.meta import Meta
from gateway.protocol.tasks import is_made
from gateway.store.base import TaskRoute
from gateway.store.made import MadeTask
from gateway.tasks.made import MadeTasks
from gateway.tasks.routes import TaskRouter
from gateway.upstream.health import Health, task_replicas
from gateway.upstream.pool import Pool
from gateway.upstream.relay import SSE_HEADERS
from gateway.upstream.replicas import Backend, Replica

log = logging.getLogger("taskgate.listen")


@dataclass(slots=True)
class Opened:
    """A listen admitted, its upstream listens started, their acknowledgements and its stream
    not yet awaited."""

    listener: ListenStream
    routes: list[TaskRoute]  # the tasks it watches (owned by the caller)
    flags: frozenset[str]
    task_ids: bool  # whether the filter named taskIds (even none): the ack then lists them
    upstream: UpstreamListen | None = None  # its upstream listens: URIs, pushed task ids
    made: tuple[MadeTask, ...] = ()  # the tasks taskgate runs that it watches (the caller's)
    acknowledged: tuple[str, ...] = ()  # every owned task id, in the client's order


class ListenHub:
    def __init__(
        self,
        settings: SubscriptionsConfig,
        *,
        pool: Pool,
        catalog: Catalog,
        table: RouteTable,
        tasks: TaskRouter,
        made: MadeTasks,
        backends: dict[str, Backend],
        health: Health,
        list_poll_s: float,
        limits: Limiter,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._catalog = catalog
        self._tasks = tasks
        self._backends = backends
        self._health = health
        self.upstream = UpstreamListens(
            backends, catalog, pool=pool, ack_timeout_s=settings.ack_timeout_s
        )
        self._lists = ListWatcher(
            catalog,
            table,
            list_poll_s,
            backends=backends,
            pool=pool,
            ack_timeout_s=settings.ack_timeout_s,
        )
        self._pollers: dict[str, Poller] = {}
        self._made = made
        self.made_watches = MadeWatches(made, made.holder.config.watch_interval_ms / 1000)
        self._listeners: set[ListenStream] = set()
        self._open = StreamCounts("listen_streams", limits)  # per tenant and principal
        self.pending = PendingBudget(
            settings.max_pending_bytes, "subscriptions.max_pending_bytes"
        )  # what the streams owe their clients, together
        self._draining = False
        self.idle = asyncio.Event()  # set while no stream is open and no task is polled
        self.idle.set()

    @property
    def lists(self) -> ListWatcher:
        """The list_changed comparison, shared with the 2025-era GET streams."""
        return self._lists

    @property
    def streams(self) -> int:
        return len(self._listeners)

    @property
    def pollers(self) -> int:
        return len(self._pollers)

    async def open(self, message: RPCRequest, meta: Meta, principal: Principal) -> Opened:
        """Admit a listen: its filter, the limits, the owner check of each task id, and its
        upstream listens started; raises the error that refuses it. Their acknowledgements are
        awaited in serve(), after the request's coordinator slot is given back: a silent
        backend must not hold a slot for `subscriptions.ack_timeout_s`."""
        settings = self._settings
        wanted = parse_filter(
            message,
            meta,
            max_task_ids=settings.max_task_ids,
            max_resource_uris=settings.max_resource_uris,
        )
        if self._draining:
            raise Retryable("taskgate is shutting down; listen again", request_id=message.id)
        if len(self._listeners) >= settings.max_streams:
            raise Retryable(
                "Too many listen streams on this taskgate (subscriptions.max_streams); retry",
                request_id=message.id,
            )
        self._open.check(principal, message.id)
        listener = ListenStream(message.id, principal.tenant, principal.subject, self.pending)
        # Its place is taken now, before the first await: concurrent listens cannot all pass
        # the limits above. serve() gives it back, or the refusal below does.
        self._take(listener)
        upstream: UpstreamListen | None = None
        try:
            routes, made, owned_ids = await self._owned(wanted.task_ids, principal, message.id)
            # Upstream listens for the resource URIs and, on its owner, for each task that may be
            # pushed, acknowledged while the rest is decided.
            owned: list[tuple[TaskRoute, Replica]] = []
            for route in routes:
                owner = self._owner(route)
                if owner is not None:
                    owned.append((route, owner))
            if wanted.resource_uris or owned:
                upstream = await self.upstream.subscribe(
                    listener, wanted.resource_uris, principal, owned
                )
            flags = await self._list_flags(wanted.flags)
        except BaseException:
            if upstream is not None:
                await upstream.close()
            self._give_back(listener)
            raise
        asked = TASK_IDS in message.params["notifications"]
        return Opened(
            listener, routes, frozenset(flags), asked, upstream, tuple(made), tuple(owned_ids)
        )

    async def _owned(
        self, task_ids: tuple[str, ...], principal: Principal, request_id: RequestId
    ) -> tuple[list[TaskRoute], list[MadeTask], list[str]]:
        """The caller's tasks among `task_ids`: the routes of the backends' tasks, the records
        of taskgate's own, and their ids in the client's order. Unknown, expired, malformed and
        other callers' ids are left out alike (invariant 2)."""
        routes: list[TaskRoute] = []
        made: list[MadeTask] = []
        owned: list[str] = []
        for task_id in task_ids:
            try:
                if is_made(task_id):  # one of taskgate's own: watched in its store
                    made.append(await self._made.owned(task_id, principal, request_id))
                else:
                    routes.append(await self._tasks.resolve(task_id, principal, request_id))
            except TaskNotFound:
                continue
            owned.append(task_id)
        return routes, made, owned

    async def _list_flags(self, wanted: frozenset[str]) -> set[str]:
        """The list_changed flags of `wanted` a listen is acknowledged: tools' always; prompts'
        and resources' when taskgate serves that list."""
        flags = {"toolsListChanged"} & wanted
        if "promptsListChanged" in wanted and await self._catalog.serves("prompts"):
            flags.add("promptsListChanged")
        if "resourcesListChanged" in wanted and await self._catalog.serves("resources"):
            flags.add("resourcesListChanged")
        return flags

    async def serve(self, request: DownstreamRequest, opened: Opened) -> Stream:
        """The acknowledgement, then the stream of an opened listen, until the client leaves or
        taskgate drains; before the stream starts, still a refusal (max_pollers)."""
        listener = opened.listener
        upstream = opened.upstream
        polled: list[TaskRoute] = []
        try:
            uris = await upstream.acknowledged() if upstream is not None else []
            pushed = upstream.pushed if upstream is not None else frozenset()
            polled = [route for route in opened.routes if route.task_id not in pushed]
            new = sum(1 for route in polled if route.task_id not in self._pollers)
            if len(self._pollers) + new > self._settings.max_pollers:
                polled = []
                raise Retryable(
                    "taskgate polls as many tasks as subscriptions.max_pollers allows; retry",
                    request_id=listener.subscription_id,
                )
            # A type taskgate does not carry is omitted from the acknowledgement (the schema's
            # SubscriptionsAcknowledgedNotificationParams): resourceSubscriptions when no URI
            # asked for is acknowledged by an upstream listen (gateway/listen/upstream.py).
            honoured: dict[str, Any] = {flag: True for flag in sorted(opened.flags)}
            if uris:
                honoured[RESOURCES] = uris
            if opened.task_ids:
                # every owned id, pushed or polled: the client cannot tell which
                honoured[TASK_IDS] = list(opened.acknowledged)
            acknowledgement = listener.notification(ACKNOWLEDGED, {"notifications": honoured})
            if opened.flags:
                await self._lists.watch(listener, opened.flags)
            for route in polled:
                self._poll(route, listener)
            for record in opened.made:
                self.made_watches.watch(record.task_id, record.tenant, record.principal, listener)
            stream = request.stream(200, dict(SSE_HEADERS))
            if self._draining:
                listener.end()
            await listener.run(stream, acknowledgement, self._settings.keepalive_s, request.cut)
            return stream
        finally:
            listener.close()  # what it still owes is let go, refused or ended alike
            self._lists.forget(listener)
            for route in polled:
                self._unpoll(route.task_id, listener)
            for record in opened.made:
                self.made_watches.unwatch(record.task_id, listener)
            if opened.upstream is not None:
                await opened.upstream.close()  # every upstream listen ends with the stream
            self._give_back(listener)

    def reconfigure(
        self,
        settings: SubscriptionsConfig,
        *,
        catalog: Catalog,
        table: RouteTable,
        backends: dict[str, Backend],
        health: Health,
        list_poll_s: float,
    ) -> None:
        """Take a reloaded configuration's parts (gateway/ops/reload.py). Streams open now keep
        their upstream listens and pollers as they are; what they and new listens look up
        next (owners, lists, limits) comes from these."""
        self._settings = settings
        self.pending.limit = settings.max_pending_bytes
        self._catalog = catalog
        self._backends = backends
        self._health = health
        self._lists.reconfigure(
            catalog, table, list_poll_s, backends=backends, ack_timeout_s=settings.ack_timeout_s
        )
        self.upstream.reconfigure(backends, catalog, ack_timeout_s=settings.ack_timeout_s)

    def drain(self) -> None:
        """End every stream gracefully (the listen's result, then close) and admit no more."""
        self._draining = True
        for listener in self._listeners:
            listener.end()

    async def close(self) -> None:
        pollers = [p.task for p in self._pollers.values() if p.task is not None]
        for task in pollers:
            task.cancel()
        await asyncio.gather(*pollers, return_exceptions=True)
        self._pollers.clear()
        await self.made_watches.close()
        await self._lists.close()
        await self.upstream.close()

    def _owner(self, route: TaskRoute) -> Replica | None:
        """The replica a task lives on, to listen to for it; None when its backend's replicas
        share their tasks (any of them may publish a change: it is polled) or it is gone."""
        backend = self._backends.get(route.backend)
        if backend is None or backend.task_affinity != "replica":
            return None
        view = self._catalog.last_view(route.backend)
        if view is None or not may_push_tasks(view):
            return None  # it cannot push (FastMCP 4.1.4), or taskgate has not seen it yet
        replicas = task_replicas(self._backends, self._health, route)
        return replicas[0] if replicas else None

    def _poll(self, route: TaskRoute, listener: ListenStream) -> None:
        poller = self._pollers.get(route.task_id)
        if poller is None:
            backend = self._backends.get(route.backend)
            if backend is None:
                return  # a reload removed its backend: nothing can answer for it now
            poller = Poller(
                route,
                backend,
                lambda: task_replicas(self._backends, self._health, route),
                self._settings,
                self._tasks.task_input,
            )
            self._pollers[route.task_id] = poller
            poller.watch(listener)
            poller.task = asyncio.create_task(poller.run(self._pool))
            poller.task.add_done_callback(lambda _: self._ended(route.task_id, poller))
        else:
            poller.watch(listener)

    def _unpoll(self, task_id: str, listener: ListenStream) -> None:
        poller = self._pollers.get(task_id)
        if poller is None:
            return
        poller.unwatch(listener)
        if not poller.watchers and poller.task is not None:
            poller.task.cancel()  # nobody watches: no more calls to the owner

    def _take(self, listener: ListenStream) -> None:
        self._listeners.add(listener)
        self._open.take(listener.tenant, listener.principal)
        self.idle.clear()

    def _give_back(self, listener: ListenStream) -> None:
        self._listeners.discard(listener)
        self._open.give_back(listener.tenant, listener.principal)
        self._check_idle()

    def _check_idle(self) -> None:
        if not self._listeners and not self._pollers:
            self.idle.set()

    def _ended(self, task_id: str, poller: Poller) -> None:
        if self._pollers.get(task_id) is poller:
            del self._pollers[task_id]
            self._check_idle()
        task = poller.task
        if task is not None and not task.cancelled() and task.exception() is not None:
            log.error("a task poller failed", exc_info=task.exception())
