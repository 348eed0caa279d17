"""list_changed for every backend, pushing or not: taskgate compares what each tenant sees.

While some stream asks for a list flag, the catalogue is looked at every `list_poll_s` (by
default discovery.refresh_s; a backend's view is fetched anew only when stale) and, per tenant
that has such a stream, each list that tenant sees is reduced to a digest of its items as
listed. A digest that moved emits the list's `notifications/*/list_changed` to that tenant's
streams that asked for it, once; a change only another tenant sees moves no digest of this one.

A backend that pushes list_changed is also listened to meanwhile (gateway/listen/
list_listens.py): each push refreshes its view at once and the digests are compared then, over
what the catalogue last saw of every backend, so that its change reaches the streams without
waiting for the next turn.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging

import orjson

from gateway.catalog.discovery import Catalog, exposed
from gateway.catalog.table import RouteTable
from gateway.catalog.views import PROMPTS, RESOURCES, TEMPLATES, TOOLS, BackendView
from gateway.errors import Retryable
from gateway.listen.filter import LIST_FLAGS
from gateway.listen.list_listens import ListListens
from gateway.listen.stream import ListenStream
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend

log = logging.getLogger("taskgate.listen")

# filter flag -> the lists whose items it covers
_KINDS = {
    "toolsListChanged": (TOOLS,),
    "promptsListChanged": (PROMPTS,),
    "resourcesListChanged": (RESOURCES, TEMPLATES),
}


def digest(flag: str, views: dict[str, BackendView], table: RouteTable, tenant: str) -> bytes:
    """What `tenant` sees of the lists `flag` covers, reduced to 16 bytes."""
    hasher = hashlib.blake2b(digest_size=16)
    for kind in _KINDS[flag]:
        for _, item in exposed(kind, views, table, tenant):
            hasher.update(orjson.dumps(item, option=orjson.OPT_SORT_KEYS))
        hasher.update(b"\0")
    return hasher.digest()


class ListWatcher:
    """The streams that asked for list flags, and the task comparing what their tenants see."""

    def __init__(
        self,
        catalog: Catalog,
        table: RouteTable,
        period_s: float,
        *,
        backends: dict[str, Backend],
        pool: Pool,
        ack_timeout_s: float,
    ) -> None:
        self._catalog = catalog
        self._table = table
        self._period_s = period_s
        self._flags: dict[ListenStream, frozenset[str]] = {}
        self._seen: dict[tuple[str, str], bytes] = {}  # (tenant, flag) -> digest
        self._task: asyncio.Task[None] | None = None
        self.pushes = ListListens(
            pool, catalog, backends, self._refreshed, ack_timeout_s=ack_timeout_s
        )

    def reconfigure(
        self,
        catalog: Catalog,
        table: RouteTable,
        period_s: float,
        *,
        backends: dict[str, Backend],
        ack_timeout_s: float,
    ) -> None:
        """Compare through a reloaded catalogue and route table from the next turn on; a list
        the reload changed for a tenant is then a list_changed like any other. The upstream
        list listens start over with the reloaded backends."""
        self._catalog = catalog
        self._table = table
        self._period_s = period_s
        self.pushes.reconfigure(catalog, backends, ack_timeout_s=ack_timeout_s)
        if self._flags:
            self.pushes.sync(self._known())

    async def watch(self, listener: ListenStream, flags: frozenset[str]) -> None:
        """Start comparing for `listener`'s tenant from what it sees now (a retryable error
        when no backend answers: the stream would have no baseline to compare against)."""
        views = await self._catalog.views()
        for flag in flags:
            key = (listener.tenant, flag)
            if key not in self._seen:
                self._seen[key] = digest(flag, views, self._table, listener.tenant)
        self._flags[listener] = flags
        self.pushes.sync(views)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())

    def forget(self, listener: ListenStream) -> None:
        self._flags.pop(listener, None)
        tenants = {
            (listener.tenant, flag) for listener, flags in self._flags.items() for flag in flags
        }
        for key in [key for key in self._seen if key not in tenants]:
            del self._seen[key]
        if not self._flags:
            self.pushes.stop()  # nobody asks for a list: no upstream list listen either

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.pushes.close()

    async def _run(self) -> None:
        while self._flags:
            await asyncio.sleep(self._period_s)  # the comparison's cadence
            try:
                views = await self._catalog.views()
            except Retryable as exc:
                log.warning("list_changed: %s; compared again in %g s", exc.message, self._period_s)
                continue
            if self._flags:  # the last stream may have gone while the catalogue answered
                self.pushes.sync(views)  # a backend that began or stopped pushing
            self.compare(views)

    def _refreshed(self) -> None:
        """After a pushed refresh: compare over what the catalogue knows now, asking nothing."""
        views = self._known()
        if self._flags:
            self.pushes.sync(views)
        self.compare(views)

    def _known(self) -> dict[str, BackendView]:
        """What the catalogue last saw of each routed backend (views() without asking)."""
        known: dict[str, BackendView] = {}
        for name in self._table.backends():
            view = self._catalog.last_view(name)
            if view is not None:
                known[name] = view
        return known

    def compare(self, views: dict[str, BackendView]) -> None:
        """Emit list_changed to each stream whose tenant now sees another list."""
        for key, before in list(self._seen.items()):
            tenant, flag = key
            after = digest(flag, views, self._table, tenant)
            if after == before:
                continue
            self._seen[key] = after
            for listener, flags in self._flags.items():
                if listener.tenant == tenant and flag in flags:
                    listener.push_list_changed(LIST_FLAGS[flag])
