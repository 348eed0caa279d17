"""What backends push, relayed over taskgate's own upstream listens: resource subscriptions,
and task ids on the replica that owns them. (A backend's list_changed is heard over listens
shared by every stream, gateway/listen/list_listens.py: it only says to look again.)

A downstream listen's `resourceSubscriptions` are routed as resources/read routes a URI (a
route naming it whose backend lists it, else a visible route with a template that could
produce it): unknown, unrouted and hidden URIs are left out alike. The rest are grouped by
backend, and each replica of each such backend gets one `subscriptions/listen` of taskgate's
own (its own id, the headers and `_meta` of taskgate's calls, the backend's credentials and
the caller's identity headers) naming that backend's URIs. The SDK's MCPServer keeps events on
the replica where they happen (an in-memory bus), hence a listen on every replica; the
ListenStream coalesces per URI, so a change seen twice costs at most one more event.

Its `taskIds` (each already through the tasks/get ownership check) go to the replica that owns
the task, where it lives and changes, with the tasks extension declared in `_meta` and the
identity of the task's owner; a replica that gets URIs and task ids under the same headers gets
them on one listen. Tasks of a backend whose replicas share their tasks
(`task_affinity: backend`) are not asked for: any replica may publish their changes, so they
are polled (gateway/listen/pollers.py).

The downstream acknowledgement waits for the upstream ones, at most
`subscriptions.ack_timeout_s`: a URI is honoured when a replica of its backend acknowledged it;
a task id is pushed when its owner acknowledged it, and polled otherwise (a backend that answers
with an error, as FastMCP 4.1.4 does with HTTP 404 -32601, one whose listen ignores `taskIds`,
or one that stays silent). Listens that relay nothing are closed before the acknowledgement
goes out. After it, each upstream `notifications/resources/updated` for an honoured URI and
each `notifications/tasks` for a pushed task id reaches the ListenStream (params less the
upstream's `_meta` and any `resultType`) with the client's subscriptionId; every other message,
comment and the listen's own result is dropped. A terminal task snapshot ends this listen's
interest in that task, and a listen left with nothing to relay is closed.

Its upstream listens (gateway/listen/upstream_leg.py) are opened again when they end or fail,
while they relay something; everything ends with the downstream stream.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

from gateway.auth import Principal
from gateway.catalog.discovery import Catalog
from gateway.listen.stream import ListenStream
from gateway.listen.upstream_leg import Leg, LegPlan
from gateway.listen.upstream_wire import UPDATED
from gateway.protocol.tasks import TERMINAL
from gateway.store.base import TaskRoute
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend, Replica


class UpstreamListens:
    """Every upstream listen of this process. Each stream holds a connection of the process's
    pool (gateway/upstream/pool.py) for as long as it lasts; the pool caps no origin, so a
    stream never takes a connection that a call needs."""

    def __init__(
        self,
        backends: dict[str, Backend],
        catalog: Catalog,
        *,
        pool: Pool,
        ack_timeout_s: float,
    ) -> None:
        self.pool = pool
        self._backends = backends
        self._catalog = catalog
        self.ack_timeout_s = ack_timeout_s
        self._ids = itertools.count(1)
        self._sets: set[UpstreamListen] = set()
        self.streams = 0  # upstream listen answers open now (acknowledged or not yet)

    def reconfigure(
        self, backends: dict[str, Backend], catalog: Catalog, *, ack_timeout_s: float
    ) -> None:
        """Route the next subscriptions with a reloaded configuration's parts; upstream
        listens open now go on as they were opened."""
        self._backends = backends
        self._catalog = catalog
        self.ack_timeout_s = ack_timeout_s

    @property
    def listens(self) -> int:
        """Downstream listens with upstream listens of their own, open now."""
        return len(self._sets)

    async def subscribe(
        self,
        listener: ListenStream,
        uris: tuple[str, ...],
        principal: Principal,
        tasks: Sequence[tuple[TaskRoute, Replica]] = (),
    ) -> UpstreamListen:
        """Route `uris` for `principal`, group them with `tasks` (each route with its owning
        replica) by replica, and open the upstream listens, without waiting for their
        acknowledgements (UpstreamListen.acknowledged does)."""
        by_backend: dict[str, list[str]] = {}
        for uri in uris:
            route = await self._catalog.resource_route(uri, principal.tenant)
            if route is not None:
                by_backend.setdefault(route.backend, []).append(uri)
        # (replica URL, headers) -> what one listen there names
        plans: dict[tuple[str, tuple[tuple[str, str], ...]], LegPlan] = {}

        def plan(replica: Replica, backend: Backend, headers: dict[str, str]) -> LegPlan:
            key = (replica.url, tuple(sorted(headers.items())))
            found = plans.get(key)
            if found is None:
                found = plans[key] = LegPlan(replica, headers, backend.task_timeout_s)
            return found

        for name, wanted in by_backend.items():
            backend = self._backends[name]
            headers = {
                **backend.credentials,
                **backend.identity(principal.tenant, principal.subject),
            }
            for replica in backend.replicas:
                plan(replica, backend, headers).uris.extend(wanted)
        for task, owner in tasks:
            backend = self._backends[task.backend]
            headers = {**backend.credentials, **backend.identity(task.tenant, task.principal)}
            plan(owner, backend, headers).task_ids.append(task.task_id)
        upstream = UpstreamListen(self, listener, uris)
        for p in plans.values():
            upstream.add(Leg(self, upstream, p, tuple(p.uris), tuple(p.task_ids)))
        self._sets.add(upstream)
        upstream.start()
        return upstream

    async def close(self) -> None:
        for upstream in list(self._sets):
            await upstream.close()

    def next_id(self) -> str:
        return f"taskgate-listen-{next(self._ids)}"

    def forget(self, upstream: UpstreamListen) -> None:
        self._sets.discard(upstream)


class UpstreamListen:
    """The upstream listens of one downstream listen, and what they relay to its ListenStream."""

    __slots__ = (
        "_early",
        "_honoured",
        "_legs",
        "_owner",
        "_uris",
        "decided",
        "listener",
        "pushed",
    )

    def __init__(
        self, owner: UpstreamListens, listener: ListenStream, uris: tuple[str, ...]
    ) -> None:
        self._owner = owner
        self.listener = listener
        self._uris = uris  # as the client asked, in its order
        self._legs: list[Leg] = []
        self._honoured: frozenset[str] = frozenset()
        self.pushed: frozenset[str] = frozenset()  # the task ids an owner acknowledged
        # events seen before the decision, the latest per subject
        self._early: dict[tuple[str, str], tuple[Leg, dict[str, Any]]] = {}
        self.decided = asyncio.Event()  # set once the downstream acknowledgement is decided

    def add(self, leg: Leg) -> None:
        self._legs.append(leg)

    def start(self) -> None:
        for leg in self._legs:
            leg.task = asyncio.create_task(leg.run())

    async def acknowledged(self) -> list[str]:
        """The URIs to acknowledge downstream, in the client's order: those a replica of their
        backend acknowledged within ack_timeout_s; and `pushed`, the task ids their owner
        acknowledged as soon. The listens that relay nothing are closed; the others relay from
        now on."""
        legs = self._legs
        if legs:
            try:
                async with asyncio.timeout(self._owner.ack_timeout_s):
                    await asyncio.gather(*(leg.resolved.wait() for leg in legs))
            except TimeoutError:
                pass  # a silent replica honours nothing
        honoured: set[str] = set()
        pushed: set[str] = set()
        for leg in legs:
            honoured.update(leg.acked)
            pushed.update(leg.acked_tasks)
            leg.following.update(t for t in leg.task_ids if t in leg.acked_tasks)
        self._honoured = frozenset(honoured)
        self.pushed = frozenset(pushed)
        self.decided.set()
        early, self._early = self._early, {}
        for (kind, _), (leg, params) in early.items():
            if kind == "task":
                self.task_moved(leg, params)
            else:
                self.updated(leg, params)
        # A listen that relays nothing (its backend honours nothing, or its tasks ended before
        # the decision) is closed, and its answer released, before the acknowledgement goes out.
        idle = [leg.task for leg in legs if leg.task is not None and not self.relays(leg)]
        for task in idle:
            task.cancel()
        await asyncio.gather(*idle, return_exceptions=True)
        return [uri for uri in self._uris if uri in self._honoured]

    def relays(self, leg: Leg) -> bool:
        """Whether `leg` has anything left to relay: a URI the downstream acknowledgement
        names, or a task it follows."""
        return bool(leg.following) or not self._honoured.isdisjoint(leg.uris)

    def updated(self, leg: Leg, params: dict[str, Any]) -> None:
        """An upstream resources/updated (params less the upstream's `_meta`)."""
        uri = params.get("uri")
        if not isinstance(uri, str) or uri not in leg.uris:
            return  # not one this backend was asked about
        if not self.decided.is_set():
            if uri in leg.acked:
                self._early.pop(("resource", uri), None)
                self._early[("resource", uri)] = (leg, params)
            return
        if uri in self._honoured:
            listener = self.listener
            listener.push(("resource", uri), listener.notification(UPDATED, params))

    def task_moved(self, leg: Leg, snapshot: dict[str, Any]) -> None:
        """An upstream notifications/tasks, or a fresh tasks/get (less `_meta`, resultType)."""
        task_id = snapshot.get("taskId")
        if not isinstance(task_id, str):
            return
        if not self.decided.is_set():
            if task_id in leg.acked_tasks:
                self._early.pop(("task", task_id), None)
                self._early[("task", task_id)] = (leg, snapshot)
            return
        if task_id not in leg.following:
            return  # not asked for, not acknowledged, or ended
        # A fresh tasks/get and the listen's own events may cross: never relay an older state
        # after a newer one (one backend writes lastUpdatedAt one way, so the strings compare).
        stamp = snapshot.get("lastUpdatedAt")
        if isinstance(stamp, str):
            last = leg.latest.get(task_id)
            if last is not None and stamp < last:
                return
            leg.latest[task_id] = stamp
        self.listener.push_task(task_id, snapshot)
        if snapshot.get("status") in TERMINAL:
            leg.following.discard(task_id)  # the last snapshot there will be

    async def close(self) -> None:
        """End every upstream listen of this downstream listen and release its answers (kept
        by the owner until they are: its close() finishes what a cancelled close left)."""
        tasks = [leg.task for leg in self._legs if leg.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._owner.forget(self)
