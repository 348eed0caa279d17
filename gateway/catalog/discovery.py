"""What taskgate knows of its backends: their tools, prompts, resources, resource templates and
capabilities, kept fresh; and the merged, per-tenant lists taskgate answers from it.

A backend's view is read anew (gateway/catalog/fetch.py) when stale, one refresh at a time and
no sooner than `min_retry_s` after the last attempt (unless a replica pushed a list_changed);
what the discover results say the backends serve is read by gateway/catalog/capabilities.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway import __version__
from gateway.bridge.eras import Eras
from gateway.catalog.capabilities import (
    advertised,
    common_versions,
    serves,
    serves_completions,
)
from gateway.catalog.fetch import DISCOVERY_TIMEOUT_S, fetch_view
from gateway.catalog.pages import Entry, SortKey, decode_cursor, page
from gateway.catalog.served import served_warnings
from gateway.catalog.table import Route, RouteTable
from gateway.catalog.views import PROMPTS, RESOURCES, TEMPLATES, BackendView, ListKind
from gateway.errors import Retryable
from gateway.protocol.meta import SERVER_INFO_KEY, SUPPORTED_VERSIONS
from gateway.upstream.calls import UpstreamCallError
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend, Replica

log = logging.getLogger("taskgate.discovery")

SERVER_INFO = {"name": "taskgate", "version": __version__}


@dataclass(slots=True)
class _Slot:
    view: BackendView | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_attempt: float = float("-inf")
    background: asyncio.Task[BackendView | None] | None = None


class Catalog:
    """Per-backend views, refreshed at most every `refresh_s`, one refresh at a time."""

    def __init__(
        self,
        pool: Pool,
        backends: dict[str, Backend],
        table: RouteTable,
        *,
        refresh_s: float,
        page_size: int = 100,
        min_retry_s: float = 1.0,
        report: bool = True,
    ) -> None:
        self._pool = pool
        self._backends = backends
        # What each replica speaks, learned as the views are read; a new catalogue (a reload)
        # learns it again.
        self.eras = Eras(pool, backends, DISCOVERY_TIMEOUT_S)
        self._table = table
        self._refresh_s = refresh_s
        self._page_size = page_size
        self._min_retry_s = min_retry_s
        self._slots = {name: _Slot() for name in backends}
        self._report_warnings = report  # log warnings() as they change
        self._warned: frozenset[str] = frozenset()  # what discovery last said of the routes

    def warm(self) -> None:
        """Start fetching every backend's view, so that the first calls find it ready."""
        for name, slot in self._slots.items():
            self._refresh_later(name, slot)

    async def close(self) -> None:
        """End the background refreshes, then taskgate's own sessions on 2025-era replicas."""
        tasks = [s.background for s in self._slots.values() if s.background is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.eras.close()

    async def knows(self, backend: str, tool: str) -> bool | None:
        """Whether `backend` has `tool`; None when taskgate cannot tell (the backend is down).

        A known tool answers from memory and refreshes a stale view in the background; an
        unknown one waits for one fresh look (rate-limited), since the tool may be new.
        """
        slot = self._slots[backend]
        view = slot.view
        if view is not None and tool in view.tools:
            if self._stale(view):
                self._refresh_later(backend, slot)
            return True
        view = await self._refresh(backend, slot, force=True)
        if view is None:
            return None
        return tool in view.tools

    async def knows_prompt(self, backend: str, name: str) -> bool | None:
        """Whether `backend` lists prompt `name`; None when taskgate cannot tell."""
        return await self._knows_item(backend, PROMPTS, name)

    async def knows_resource(self, backend: str, uri: str) -> bool | None:
        """Whether `backend` lists resource `uri` in resources/list; None when taskgate cannot
        tell. A URI expanded from a template is not listed: only the backend can judge it."""
        return await self._knows_item(backend, RESOURCES, uri)

    async def knows_template(self, backend: str, uri_template: str) -> bool | None:
        """Whether `backend` lists this exact `uriTemplate`; None when taskgate cannot tell."""
        return await self._knows_item(backend, TEMPLATES, uri_template)

    async def _knows_item(self, backend: str, kind: ListKind, key: str) -> bool | None:
        """`knows` for an optional list: from memory when known, else after one fresh look."""
        slot = self._slots[backend]
        view = slot.view
        if view is not None and key in getattr(view, kind.name):
            if self._stale(view):
                self._refresh_later(backend, slot)
            return True
        view = await self._refresh(backend, slot, force=True)
        if view is None:
            return None
        return key in getattr(view, kind.name)

    async def resource_route(self, uri: str, tenant: str) -> Route | None:
        """The route `uri` is read through for `tenant`: a route naming it (exact or glob) whose
        backend lists it; else the first visible route with a template that could produce it
        (named, or listed by the backend and matched by a glob), whose backend lists that
        template; None for anything else. resources/read and the
        resource subscriptions of a listen route alike."""
        route = self._table.lookup_resource(uri, tenant)
        # A URI a glob reaches but the backend does not list may still be a template's expansion.
        if route is not None and await self.knows_resource(route.backend, uri) is not False:
            return route
        listed = await self._listed_templates(self._table.template_glob_backends(tenant))
        for candidate, template in self._table.templates_matching(uri, tenant, listed):
            if await self.knows_template(candidate.backend, template) is not False:
                return candidate
        return None

    async def _listed_templates(self, backends: list[str]) -> dict[str, Collection[str]]:
        """The uriTemplates each backend listed when last asked, what a template glob reaches
        (a backend never asked yet is asked now, as knows_template would)."""
        found: dict[str, Collection[str]] = {}
        for backend in backends:
            view = self.last_view(backend)
            if view is None:
                view = await self._refresh(backend, self._slots[backend])
            if view is not None:
                found[backend] = view.templates.keys()
        return found

    def last_view(self, backend: str) -> BackendView | None:
        """What `backend` said when last asked, without asking again."""
        slot = self._slots.get(backend)
        return slot.view if slot is not None else None

    async def refresh_from(self, backend: str, replica: Replica) -> BackendView | None:
        """`backend`'s view fetched anew, from `replica` first, whatever its age and the retry
        floor: that replica pushed a list_changed (gateway/listen/list_listens.py runs one such
        refresh per backend at a time, with at most one more waiting). None when `backend` is
        not in this catalogue."""
        slot = self._slots.get(backend)
        if slot is None:
            return None
        return await self._refresh(backend, slot, source=replica)

    async def views(self) -> dict[str, BackendView]:
        """A fresh view of every routed backend that answers, refreshed concurrently.

        A backend that does not answer is left out (and logged); when none answers, the client
        gets the retryable error rather than an empty tool list it would take for the truth.
        """
        names = self._table.backends()
        views = await asyncio.gather(*(self._refresh(n, self._slots[n]) for n in names))
        found = {name: view for name, view in zip(names, views, strict=True) if view is not None}
        if names and not found:
            raise Retryable("No backend answered discovery; retry")
        return found

    async def discover_result(self) -> dict[str, Any]:
        """taskgate's own server/discover result, merged from its backends'."""
        found = await self.views()
        return {
            "resultType": "complete",
            "supportedVersions": common_versions(found.values()) or list(SUPPORTED_VERSIONS),
            "capabilities": advertised(found, self._table),
            "ttlMs": int(self._refresh_s * 1000),
            "cacheScope": "public",
            "_meta": {SERVER_INFO_KEY: SERVER_INFO},
        }

    async def tools_result(self, tenant: str) -> dict[str, Any]:
        """tools/list: every tool a route exposes to `tenant`, grouped by route in YAML order,
        by name within a route."""
        exposed: list[tuple[int, str, dict[str, Any]]] = []
        for backend, view in (await self.views()).items():
            for name, tool in view.tools.items():
                route = self._table.lookup(name, tenant)
                if route is not None and route.backend == backend:
                    exposed.append((route.index, name, tool))
        exposed.sort(key=lambda item: (item[0], item[1]))
        return {
            "resultType": "complete",
            "tools": [tool for _, _, tool in exposed],
            "ttlMs": int(self._refresh_s * 1000),
            "cacheScope": "private",
            "_meta": {SERVER_INFO_KEY: SERVER_INFO},
        }

    async def prompts_result(self, tenant: str, cursor: object = None) -> dict[str, Any]:
        """prompts/list: one page of the prompts routes expose to `tenant` (BadCursor)."""
        return await self._list_result(PROMPTS, tenant, cursor)

    async def resources_result(self, tenant: str, cursor: object = None) -> dict[str, Any]:
        """resources/list: one page of the resources routes expose to `tenant` (BadCursor)."""
        return await self._list_result(RESOURCES, tenant, cursor)

    async def templates_result(self, tenant: str, cursor: object = None) -> dict[str, Any]:
        """resources/templates/list: one page of the templates routes expose to `tenant`."""
        return await self._list_result(TEMPLATES, tenant, cursor)

    async def serves(self, capability: Literal["prompts", "resources", "completions"]) -> bool:
        """Whether a backend that answers advertises `capability` and a route names items of
        that kind on it (prompts; resources or resource_templates; prompts or templates for
        completions): what discover advertises, and so what taskgate serves."""
        views = await self.views()
        if capability == "completions":
            return serves_completions(views, self._table)
        return serves(views, self._table, capability)

    async def _list_result(self, kind: ListKind, tenant: str, cursor: object) -> dict[str, Any]:
        after = decode_cursor(kind.name, cursor)  # a bad cursor costs no upstream look
        entries = exposed(kind, await self.views(), self._table, tenant)
        return list_result(kind, entries, after, self._page_size, int(self._refresh_s * 1000))

    def _stale(self, view: BackendView) -> bool:
        return time.monotonic() - view.fetched_at >= self._refresh_s

    def _refresh_later(self, backend: str, slot: _Slot) -> None:
        if slot.background is None or slot.background.done():
            slot.background = asyncio.create_task(self._refresh(backend, slot))

    async def _refresh(
        self, backend: str, slot: _Slot, *, force: bool = False, source: Replica | None = None
    ) -> BackendView | None:
        """The slot's view, fetched anew when stale (or when forced and not fetched just now;
        always, from `source` first, when given)."""
        async with slot.lock:
            now = time.monotonic()
            view = slot.view
            fresh = view is not None and not self._stale(view)
            held = (fresh and not force) or now - slot.last_attempt < self._min_retry_s
            if held and source is None:
                return view
            slot.last_attempt = now
            try:
                slot.view = await fetch_view(
                    self._pool, self.eras, self._backends[backend], slot.view, source
                )
            except UpstreamCallError as exc:
                log.warning("cannot refresh backend %r: %s", backend, exc)
                return slot.view
            if self._report_warnings:
                self._report()
            return slot.view

    def warnings(self) -> list[str]:
        """What the routes do with the items the backends last listed: shadowed items, items
        served by two backends (gateway/catalog/served.py)."""
        views = {name: slot.view for name, slot in self._slots.items() if slot.view is not None}
        served = {
            "tools": {name: view.tools.keys() for name, view in views.items()},
            "prompts": {name: view.prompts.keys() for name, view in views.items()},
            "resources": {name: view.resources.keys() for name, view in views.items()},
            "resource_templates": {name: view.templates.keys() for name, view in views.items()},
        }
        return served_warnings(self._table, served)

    def _report(self) -> None:
        """Log each warning once while it holds; one that goes and comes back is logged again."""
        found = self.warnings()
        for warning in found:
            if warning not in self._warned:
                log.warning("%s", warning)
        self._warned = frozenset(found)


def exposed(
    kind: ListKind, views: Mapping[str, BackendView], table: RouteTable, tenant: str
) -> list[Entry]:
    """The items of list `kind` a route exposes to `tenant` on a backend that serves them, by
    route in YAML order, then by name or URI: the rule tools_result follows."""
    entries: list[Entry] = []
    for backend, view in views.items():
        for key, item in getattr(view, kind.name).items():
            route = kind.lookup(table, key, tenant)
            if route is not None and route.backend == backend:
                entries.append(((route.index, key), item))
    entries.sort(key=lambda entry: entry[0])
    return entries


def list_result(
    kind: ListKind, entries: list[Entry], after: SortKey | None, page_size: int, ttl_ms: int
) -> dict[str, Any]:
    """One page of a merged list as the list method's result: private to the caller's
    authorization, `nextCursor` only when more items follow."""
    items, next_cursor = page(kind.name, entries, after, page_size)
    result: dict[str, Any] = {"resultType": "complete", kind.field: items}
    if next_cursor is not None:
        result["nextCursor"] = next_cursor
    result |= {"ttlMs": ttl_ms, "cacheScope": "private", "_meta": {SERVER_INFO_KEY: SERVER_INFO}}
    return result
