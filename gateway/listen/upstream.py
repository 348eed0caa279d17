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
Listener coalesces per URI, so a change seen twice costs at most one more event.

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
each `notifications/tasks` for a pushed task id reaches the Listener (params less the
upstream's `_meta` and any `resultType`) with the client's subscriptionId; every other message,
comment and the listen's own result is dropped. A terminal task snapshot ends this listen's
interest in that task, and a listen left with nothing to relay is closed.

A pushed task starts, as a polled one does, with its current snapshot: one tasks/get of its
owner once the downstream acknowledgement is decided. A snapshot older (by `lastUpdatedAt`)
than one already relayed for that task is dropped, so a tasks/get and an event that cross
never leave the client on an older state.

A listen that ends or fails is opened again with backoff, naming what it still relays. Nothing
is replayed, so its new acknowledgement is followed by one resources/updated per URI it covers
(the client is told to read again) and one tasks/get per task id it covers, whose answer is
relayed as that task's fresh snapshot. A task id the new acknowledgement leaves out is one the
owner forgot (an in-memory task store that restarted): nothing more is sent for it, as when a
poller hears "Task not found". Everything ends with the downstream stream.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson

from gateway.auth import Principal
from gateway.catalog.discovery import Catalog
from gateway.listen.stream import ACKNOWLEDGED, TASK_NOTIFICATION, Listener
from gateway.protocol.codes import Code
from gateway.protocol.headers import NAME as NAME_HEADER
from gateway.protocol.headers import encode_value
from gateway.protocol.meta import (
    TASKS_EXTENSION,
)
from gateway.protocol.sse import FrameTooLarge, SSEDecoder
from gateway.protocol.tasks import TERMINAL
from gateway.store.base import TaskRoute
from gateway.upstream.calls import UpstreamCallError, UpstreamRPCError, call, own_request
from gateway.upstream.replicas import Backend, Replica

log = logging.getLogger("taskgate.listen")

LISTEN = "subscriptions/listen"
UPDATED = "notifications/resources/updated"
RESOURCES = "resourceSubscriptions"
TASK_IDS = "taskIds"
_MAX_FRAME_BYTES = 1024 * 1024  # an ack names at most max_resource_uris URIs; an event one
_MAX_REFUSAL_BYTES = 64 * 1024  # of a refusal's body, read for the log
_FIRST_BACKOFF_S = 0.5
_MAX_BACKOFF_S = 30.0
_DROPPED = ("_meta", "resultType")  # the upstream's, not the task's (as pollers.py drops)


class UpstreamListens:
    """Every upstream listen of this process, over a connection pool of their own: a stream
    holds its connection for as long as it lasts, and must not take one discovery needs."""

    def __init__(
        self,
        backends: dict[str, Backend],
        catalog: Catalog,
        *,
        ack_timeout_s: float,
    ) -> None:
        self._backends = backends
        self._catalog = catalog
        self.ack_timeout_s = ack_timeout_s
        self._session: aiohttp.ClientSession | None = None  # made on first use, in the loop
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
        listener: Listener,
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
        plans: dict[tuple[str, tuple[tuple[str, str], ...]], _Plan] = {}

        def plan(replica: Replica, backend: Backend, headers: dict[str, str]) -> _Plan:
            key = (replica.url, tuple(sorted(headers.items())))
            found = plans.get(key)
            if found is None:
                found = plans[key] = _Plan(replica, headers, backend.task_timeout_s)
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
            upstream.add(_Leg(self, upstream, p, tuple(p.uris), tuple(p.task_ids)))
        self._sets.add(upstream)
        upstream.start()
        return upstream

    async def close(self) -> None:
        for upstream in list(self._sets):
            await upstream.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=None),  # a listen lasts; see _Leg.attempt
            )
        return self._session

    def next_id(self) -> str:
        return f"taskgate-listen-{next(self._ids)}"

    def forget(self, upstream: UpstreamListen) -> None:
        self._sets.discard(upstream)


class _Plan:
    """What one upstream listen will name, while subscribe groups them."""

    __slots__ = ("headers", "replica", "task_ids", "task_timeout_s", "uris")

    def __init__(self, replica: Replica, headers: dict[str, str], task_timeout_s: float) -> None:
        self.replica = replica
        self.headers = headers
        self.task_timeout_s = task_timeout_s
        self.uris: list[str] = []
        self.task_ids: list[str] = []


class UpstreamListen:
    """The upstream listens of one downstream listen, and what they relay to its Listener."""

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

    def __init__(self, owner: UpstreamListens, listener: Listener, uris: tuple[str, ...]) -> None:
        self._owner = owner
        self.listener = listener
        self._uris = uris  # as the client asked, in its order
        self._legs: list[_Leg] = []
        self._honoured: frozenset[str] = frozenset()
        self.pushed: frozenset[str] = frozenset()  # the task ids an owner acknowledged
        # events seen before the decision, the latest per subject
        self._early: dict[tuple[str, str], tuple[_Leg, dict[str, Any]]] = {}
        self.decided = asyncio.Event()  # set once the downstream acknowledgement is decided

    def add(self, leg: _Leg) -> None:
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

    def relays(self, leg: _Leg) -> bool:
        """Whether `leg` has anything left to relay: a URI the downstream acknowledgement
        names, or a task it follows."""
        return bool(leg.following) or not self._honoured.isdisjoint(leg.uris)

    def updated(self, leg: _Leg, params: dict[str, Any]) -> None:
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

    def task_moved(self, leg: _Leg, snapshot: dict[str, Any]) -> None:
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


class _Leg:
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
        owner: UpstreamListens,
        upstream: UpstreamListen,
        plan: _Plan,
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
        owner = self._owner
        replica = self.replica
        request_id = owner.next_id()
        notifications: dict[str, Any] = {}
        capabilities: dict[str, Any] = {}
        if self.uris:
            notifications[RESOURCES] = list(self.uris)
        # the first time every task id it owns; later, those it still follows
        task_ids = [t for t in self.task_ids if not fresh or t in self.following]
        if task_ids:
            notifications[TASK_IDS] = task_ids
            capabilities["extensions"] = {TASKS_EXTENSION: {}}
        body, headers = own_request(
            request_id, LISTEN, {"notifications": notifications}, capabilities, self._headers
        )
        # A task's snapshot carries its result: as large as a tasks/get answer may be.
        max_frame = max(_MAX_FRAME_BYTES, replica.max_answer_bytes if task_ids else 0)
        acked = False
        opened = False
        try:
            async with (
                asyncio.timeout(owner.ack_timeout_s) as deadline,
                owner.session().post(
                    replica.url, data=body, headers=headers, allow_redirects=False
                ) as response,
            ):
                owner.streams += 1
                opened = True
                content_type = response.headers.get("Content-Type", "").partition(";")[0]
                if response.status != 200 or content_type.strip() != "text/event-stream":
                    refusal = await response.content.read(_MAX_REFUSAL_BYTES)
                    log.debug(
                        "%s at %s refused (HTTP %d): %r",
                        LISTEN,
                        replica.label,
                        response.status,
                        refusal[:200],
                    )
                    return False
                decoder = SSEDecoder(max_frame)
                while True:
                    chunk = await response.content.readany()
                    if not chunk:
                        return acked  # the upstream ended its stream
                    for frame in decoder.feed(chunk):
                        message = sse_message(frame.data)
                        if message is None:
                            continue  # a comment (`: ping`) or not a JSON-RPC message
                        if "method" not in message:
                            if message.get("id") == request_id:
                                return acked  # the listen's result, or an error before the ack
                            continue
                        method = message["method"]
                        params = message.get("params")
                        if not isinstance(params, dict):
                            continue
                        if method == ACKNOWLEDGED and not acked:
                            acked = True
                            deadline.reschedule(None)  # acknowledged: the stream may last
                            await self._acknowledged(params, fresh=fresh)
                        elif method == UPDATED and acked:
                            self._set.updated(self, _less_envelope(params))
                        elif method == TASK_NOTIFICATION and acked:
                            self._set.task_moved(self, _less_envelope(params))
                        else:
                            continue
                        if self._set.decided.is_set() and not self._set.relays(self):
                            return acked  # its tasks ended and it has no URI: nothing to wait for
        except (TimeoutError, OSError, aiohttp.ClientError, FrameTooLarge) as exc:
            log.debug("%s at %s: %s", LISTEN, replica.label, type(exc).__name__)
            return acked
        except Exception:
            log.exception("%s at %s failed", LISTEN, replica.label)
            return acked
        finally:
            if opened:
                owner.streams -= 1

    async def _acknowledged(self, params: dict[str, Any], *, fresh: bool) -> None:
        notifications = params.get("notifications")
        if not isinstance(notifications, dict):
            notifications = {}
        uris = _strings(notifications.get(RESOURCES))
        task_ids = _strings(notifications.get(TASK_IDS))
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
                self._owner.session(),
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
            self._set.task_moved(self, {k: v for k, v in result.items() if k not in _DROPPED})


def _less_envelope(params: dict[str, Any]) -> dict[str, Any]:
    """An upstream notification's params as relayed: without the upstream's `_meta` (the
    Listener adds the client's subscriptionId) or a `resultType`."""
    return {key: value for key, value in params.items() if key not in _DROPPED}


def _strings(value: object) -> frozenset[str]:
    if not isinstance(value, list):
        return frozenset()
    return frozenset(item for item in value if isinstance(item, str))


def sse_message(data: str | None) -> dict[str, Any] | None:
    """The JSON-RPC message an SSE event carries, or None."""
    if data is None:
        return None
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return message if isinstance(message, dict) else None
