"""list_changed from backends that push it: taskgate's own upstream listens for the list flags,
one per replica of each such backend, shared by every stream of the process.

A routed backend whose last view says `listChanged: true` for tools, prompts or resources (the
MCP SDK's MCPServer does; FastMCP 4.1.4 says false) gets on each replica one
`subscriptions/listen` of taskgate's own, naming the flags of those lists, with the backend's
credentials and no caller's identity: the catalogue is read the same way, and what a tenant sees
of it is the routes' business, not the backend's. They are open while some stream of this
process asks for a list flag (gateway/listen/lists.py opens and closes them), and are opened
again with backoff (0.5 s doubling to 30 s) when they end, fail or stay unacknowledged for
`subscriptions.ack_timeout_s`.

An upstream `notifications/{tools,prompts,resources}/list_changed`, and each acknowledgement
(nothing is replayed: what changed before it is told as a change), refreshes that backend's view
at once, from the replica that pushed first (the SDK keeps events on the replica where they
happen; another replica may not have changed yet). Refreshes coalesce per backend: one in
flight, at most one more waiting, however many pushes arrive meanwhile. After each, the watcher
compares what each tenant sees, as its own turn does, so a tenant whose lists did not change is
told nothing. The watcher's digest polling goes on for every backend: it is all there is for
backends that do not push, and a safety net for those that do.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, TypeVar

from gateway.catalog.discovery import Catalog
from gateway.catalog.views import BackendView
from gateway.listen.filter import LIST_FLAGS
from gateway.listen.stream import ACKNOWLEDGED
from gateway.listen.upstream_stream import listen_stream
from gateway.listen.upstream_wire import LISTEN
from gateway.upstream.calls import own_request
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend, Replica

log = logging.getLogger("taskgate.listen")

_MAX_FRAME_BYTES = 64 * 1024  # an acknowledgement of three flags, an event with no params
_FIRST_BACKOFF_S = 0.5
_MAX_BACKOFF_S = 30.0
# the capability whose `listChanged` says a backend pushes a list -> the flag that asks for it
_CAPABILITY_FLAGS = {
    "tools": "toolsListChanged",
    "prompts": "promptsListChanged",
    "resources": "resourcesListChanged",
}
_PUSHED = frozenset(LIST_FLAGS.values())  # the notifications that refresh a view

T = TypeVar("T")


def pushed_flags(view: BackendView) -> tuple[str, ...]:
    """The list flags a backend says it pushes (`listChanged: true`), in a fixed order."""
    capabilities = view.discover.get("capabilities")
    if not isinstance(capabilities, dict):
        return ()
    return tuple(
        flag
        for capability, flag in _CAPABILITY_FLAGS.items()
        if isinstance(entry := capabilities.get(capability), dict)
        and entry.get("listChanged") is True
    )


class Coalesced(Generic[T]):
    """At most one run of `work` at a time: asks made while it runs become one more run, with
    the latest ask's argument. A burst of asks costs the run in flight and at most one more."""

    __slots__ = ("_next", "_work", "runs", "task")

    def __init__(self, work: Callable[[T], Awaitable[None]]) -> None:
        self._work = work
        self._next: T | None = None
        self.task: asyncio.Task[None] | None = None
        self.runs = 0  # runs started

    def ask(self, argument: T) -> None:
        self._next = argument
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while self._next is not None:
            argument, self._next = self._next, None
            self.runs += 1
            try:
                await self._work(argument)
            except Exception:
                log.exception("a list refresh failed")


class ListListens:
    """The upstream listens for list flags of this process, and the refreshes they cause."""

    def __init__(
        self,
        pool: Pool,
        catalog: Catalog,
        backends: dict[str, Backend],
        refreshed: Callable[[], None],
        *,
        ack_timeout_s: float,
    ) -> None:
        self.pool = pool
        self._catalog = catalog
        self._backends = backends
        self._refreshed = refreshed  # the watcher's comparison after a refresh
        self.ack_timeout_s = ack_timeout_s
        self._ids = itertools.count(1)
        # (backend, replica URL, flags) -> its listen
        self._legs: dict[tuple[str, str, tuple[str, ...]], _ListLeg] = {}
        self._refreshes: dict[str, Coalesced[Replica]] = {}
        self._ending: set[asyncio.Task[None]] = set()  # cancelled, not yet finished
        self.streams = 0  # upstream list listens answered and open now

    @property
    def listens(self) -> int:
        """Upstream list listens kept now (open, opening, or waiting to be opened again)."""
        return len(self._legs)

    @property
    def acknowledged(self) -> int:
        """Upstream list listens whose current stream the replica acknowledged."""
        return sum(1 for leg in self._legs.values() if leg.acked)

    @property
    def refreshes(self) -> int:
        """Refreshes the listens kept now have started (pushes, acknowledgements)."""
        return sum(refresh.runs for refresh in self._refreshes.values())

    @property
    def refreshing(self) -> bool:
        """Whether a refresh is running or waiting."""
        return any(r.task is not None and not r.task.done() for r in self._refreshes.values())

    def reconfigure(
        self, catalog: Catalog, backends: dict[str, Backend], *, ack_timeout_s: float
    ) -> None:
        """Listen through a reloaded configuration's parts: every listen ends now, and the
        watcher's next sync opens those the new one needs."""
        self.stop()
        self._catalog = catalog
        self._backends = backends
        self.ack_timeout_s = ack_timeout_s

    def sync(self, views: Mapping[str, BackendView]) -> None:
        """Keep one listen per replica of each backend in `views` that pushes a list, and no
        other."""
        wanted: dict[tuple[str, str, tuple[str, ...]], Replica] = {}
        for name, view in views.items():
            backend = self._backends.get(name)
            flags = pushed_flags(view)
            if backend is None or not flags:
                continue
            for replica in backend.replicas:
                wanted[(name, replica.url, flags)] = replica
        for key in [key for key in self._legs if key not in wanted]:
            self._end(self._legs.pop(key))
        for key, replica in wanted.items():
            if key not in self._legs:
                name, _, flags = key
                leg = _ListLeg(self, self._backends[name], replica, flags)
                leg.task = asyncio.create_task(leg.run())
                self._legs[key] = leg

    def stop(self) -> None:
        """End every listen (nobody asks for a list now) and every refresh they started."""
        for leg in self._legs.values():
            self._end(leg)
        self._legs.clear()
        for refresh in self._refreshes.values():
            if refresh.task is not None and not refresh.task.done():
                refresh.task.cancel()
                self._keep(refresh.task)
        self._refreshes.clear()

    async def close(self) -> None:
        self.stop()
        await asyncio.gather(*self._ending, return_exceptions=True)

    def next_id(self) -> str:
        return f"taskgate-lists-{next(self._ids)}"

    def pushed(self, backend: str, replica: Replica) -> None:
        """`replica` of `backend` pushed a list_changed, or acknowledged: refresh its view."""
        refresh = self._refreshes.get(backend)
        if refresh is None:

            async def work(source: Replica) -> None:
                await self._catalog.refresh_from(backend, source)
                log.debug("backend %r refreshed after a push from %s", backend, source.label)
                self._refreshed()

            refresh = self._refreshes[backend] = Coalesced(work)
        refresh.ask(replica)

    def _end(self, leg: _ListLeg) -> None:
        if leg.task is not None and not leg.task.done():
            leg.task.cancel()
            self._keep(leg.task)

    def _keep(self, task: asyncio.Task[None]) -> None:
        """Hold a cancelled task until it has finished (close() awaits what is left)."""
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)


class _ListLeg:
    """One upstream listen for list flags, to one replica, kept open until it is ended."""

    __slots__ = ("_owner", "acked", "backend", "flags", "replica", "task")

    def __init__(
        self, owner: ListListens, backend: Backend, replica: Replica, flags: tuple[str, ...]
    ) -> None:
        self._owner = owner
        self.backend = backend
        self.replica = replica
        self.flags = flags
        self.acked = False  # its current stream was acknowledged
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        failures = 0
        while True:
            started = time.monotonic()
            if await self.attempt() and time.monotonic() - started >= _MAX_BACKOFF_S:
                failures = 0  # it held a while: this drop starts the backoff over
            failures += 1
            delay = min(_MAX_BACKOFF_S, _FIRST_BACKOFF_S * 2 ** (failures - 1))
            log.info(
                "%s for lists at %s: listening again in %.1f s", LISTEN, self.replica.label, delay
            )
            await asyncio.sleep(delay)  # the backoff's cadence, not a synchronisation

    async def attempt(self) -> bool:
        """One upstream listen, until it ends; whether it was acknowledged."""
        request_id = self._owner.next_id()
        notifications = {flag: True for flag in self.flags}
        request = own_request(
            request_id, LISTEN, {"notifications": notifications}, {}, self.backend.credentials
        )
        acked = False

        async def heard(message: dict[str, Any], deadline: asyncio.Timeout) -> bool:
            nonlocal acked
            if self._heard(message, acked) and not acked:
                acked = self.acked = True
                deadline.reschedule(None)  # acknowledged: the stream may last
            return False

        try:
            await listen_stream(
                self._owner,
                self.replica,
                request,
                request_id,
                _MAX_FRAME_BYTES,
                heard,
                f"{LISTEN} for lists",
            )
            return acked
        finally:
            self.acked = False

    def _heard(self, message: dict[str, Any], acked: bool) -> bool:
        """Refresh on the acknowledgement and on each list_changed after it; whether the
        listen is acknowledged now."""
        method = message["method"]
        if method == ACKNOWLEDGED or (acked and method in _PUSHED):
            log.debug("%s at %s: %s", LISTEN, self.replica.label, method)
            self._owner.pushed(self.backend.name, self.replica)
            return True
        return acked
