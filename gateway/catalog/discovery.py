"""What taskgate knows of its backends: their tools, prompts, resources, resource templates and
capabilities, kept fresh; and the merged, per-tenant lists taskgate answers from it.

Discovery reads server/discover and every page of tools/list from one replica; a failure of
either makes that replica's answer unusable and the next replica is asked. The other lists are
optional: each is kept (every page read) only when discover advertises its capability
(`capabilities.prompts`, `capabilities.resources`); it is asked alongside discover when the last
discover advertised it, after it otherwise. A list that fails, whole or on any page,
is logged and keeps the items last seen for it (none on the first look): the backend keeps its
tools and its other lists, and a flaky list neither hides the backend nor empties for a refresh.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from gateway import __version__
from gateway.catalog.pages import Entry, SortKey, decode_cursor, page
from gateway.catalog.served import served_warnings
from gateway.catalog.table import Route, RouteTable
from gateway.errors import Retryable
from gateway.protocol.meta import SERVER_INFO_KEY, SUPPORTED_VERSIONS, TASKS_EXTENSION
from gateway.upstream.calls import UpstreamCallError, call
from gateway.upstream.replicas import Backend, Replica

log = logging.getLogger("taskgate.discovery")

MAX_LIST_PAGES = 100  # a backend that pages forever must not hold a refresh forever
DISCOVERY_TIMEOUT_S = 5.0
SERVER_INFO = {"name": "taskgate", "version": __version__}


@dataclass(frozen=True, slots=True)
class BackendView:
    """One backend as last seen: its discover result, its tools and prompts by name, its
    resources by uri, its resource templates by uriTemplate; each item as the backend sent it."""

    discover: dict[str, Any]
    tools: dict[str, dict[str, Any]]
    fetched_at: float
    prompts: dict[str, dict[str, Any]] = field(default_factory=dict)
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ListKind:
    """One optional list: how discovery reads it and how routes expose its items."""

    name: str  # the BackendView attribute, and the list a cursor belongs to
    method: str  # the upstream (and downstream) list method
    field: str  # the array in its result
    key: str  # the item's field that names it
    capability: str  # what discover advertises when the backend serves the list
    route_field: str  # the Route attribute naming these items
    lookup: Callable[[RouteTable, str, str], Route | None]  # the first visible route of an item


PROMPTS = ListKind(
    "prompts", "prompts/list", "prompts", "name", "prompts", "prompts", RouteTable.lookup_prompt
)
RESOURCES = ListKind(
    "resources",
    "resources/list",
    "resources",
    "uri",
    "resources",
    "resources",
    RouteTable.lookup_resource,
)
TEMPLATES = ListKind(
    "templates",
    "resources/templates/list",
    "resourceTemplates",
    "uriTemplate",
    "resources",
    "resource_templates",
    RouteTable.lookup_template,
)
LIST_KINDS = (PROMPTS, RESOURCES, TEMPLATES)
# tools/list is read with discover, not as an optional list; named for exposed() alike.
TOOLS = ListKind("tools", "tools/list", "tools", "name", "tools", "tools", RouteTable.lookup)


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
        session: aiohttp.ClientSession,
        backends: dict[str, Backend],
        table: RouteTable,
        *,
        refresh_s: float,
        page_size: int = 100,
        min_retry_s: float = 1.0,
        report: bool = True,
    ) -> None:
        self._session = session
        self._backends = backends
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
        tasks = [s.background for s in self._slots.values() if s.background is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

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
        views = found.values()
        versions = [v for v in SUPPORTED_VERSIONS if all(_speaks(view, v) for view in views)]
        extensions: dict[str, Any] = {}
        if any(TASKS_EXTENSION in _extensions(view) for view in views):
            extensions[TASKS_EXTENSION] = {}
        # Only what taskgate honours end to end: prompts (list, get), resources (both lists and
        # resources/read), completions (completion/complete routed by its ref), each when a
        # routed backend serves it; `listChanged` on each, since subscriptions/listen emulates
        # list_changed for every backend (gateway/listen/lists.py). `subscribe` only when a
        # routed backend that serves resources says it pushes resources/updated: taskgate
        # relays them over upstream listens and cannot emulate them (gateway/listen/
        # upstream.py). The SDK's MCPServer says so (`subscribe: true` at 2026-07-28, where it
        # means it serves subscriptions/listen); FastMCP 4.1.4 says `subscribe: false`.
        capabilities: dict[str, Any] = {"tools": {"listChanged": True}}
        if self._serves(found, "prompts"):
            capabilities["prompts"] = {"listChanged": True}
        if self._serves(found, "resources"):
            capabilities["resources"] = {"listChanged": True}
            if self._serves_subscribe(found):
                capabilities["resources"]["subscribe"] = True
        if self._serves_completions(found):
            capabilities["completions"] = {}
        if extensions:
            capabilities["extensions"] = extensions
        return {
            "resultType": "complete",
            "supportedVersions": versions or list(SUPPORTED_VERSIONS),
            "capabilities": capabilities,
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
            return self._serves_completions(views)
        return self._serves(views, capability)

    def _serves(self, views: Mapping[str, BackendView], capability: str) -> bool:
        kinds = [kind for kind in LIST_KINDS if kind.capability == capability]
        routed = {
            route.backend
            for route in self._table.routes
            if any(getattr(route, kind.route_field) for kind in kinds)
        }
        return any(
            _advertises(views[name].discover, capability) for name in routed if name in views
        )

    def _serves_subscribe(self, views: Mapping[str, BackendView]) -> bool:
        """Whether a backend a route names resources or templates on advertises resources
        with a truthy `subscribe`."""
        routed = {
            route.backend
            for route in self._table.routes
            if route.resources or route.resource_templates
        }
        return any(_subscribes(views[name].discover) for name in routed if name in views)

    def _serves_completions(self, views: Mapping[str, BackendView]) -> bool:
        """Whether a backend that a route names prompts or resource templates on advertises
        `completions`: completion/complete reaches only those refs."""
        routed = {
            route.backend
            for route in self._table.routes
            if route.prompts or route.resource_templates
        }
        return any(
            _advertises(views[name].discover, "completions") for name in routed if name in views
        )

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
                slot.view = await self._fetch(self._backends[backend], slot.view, source)
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

    async def _fetch(
        self, backend: Backend, previous: BackendView | None, first: Replica | None = None
    ) -> BackendView:
        """Ask the replicas in turn (`first` first, when given) until one answers discover and
        tools/list; read the optional lists it advertises from that replica, keeping `previous`
        items of a list that fails."""
        failure: UpstreamCallError | None = None
        for attempt, _ in enumerate(backend.replicas):
            replica = first if attempt == 0 and first is not None else backend.pick()
            try:
                return await self._fetch_from(backend, replica, previous)
            except UpstreamCallError as exc:
                failure = exc
        assert failure is not None  # a backend has at least one replica
        raise failure

    async def _fetch_from(
        self, backend: Backend, replica: Replica, previous: BackendView | None
    ) -> BackendView:
        """One replica's view. discover, tools/list and the optional lists `previous` advertised
        are asked at once: one round trip rather than three, which a refresh pushed by a
        list_changed is timed on (a kept-alive backend connection can stall ~40 ms a round on
        delayed ACKs). A list the new discover advertises and the old did not is read after;
        one it no longer advertises is dropped."""
        guessed = [
            k for k in LIST_KINDS if previous and _advertises(previous.discover, k.capability)
        ]
        asked_discover = asyncio.ensure_future(
            call(
                self._session,
                replica,
                "server/discover",
                timeout_s=DISCOVERY_TIMEOUT_S,
                headers=backend.credentials,
            )
        )
        asked_tools = asyncio.ensure_future(
            self._read_list(backend, replica, "tools/list", "tools", "name")
        )
        asked = {
            k.name: asyncio.ensure_future(self._optional_list(backend, replica, k, previous))
            for k in guessed
        }
        every = [asked_discover, asked_tools, *asked.values()]
        try:
            await asyncio.gather(*every)
        except BaseException:  # discover or tools failed (or we were cancelled): end the rest
            for task in every:
                task.cancel()
            await asyncio.gather(*every, return_exceptions=True)
            raise
        discover = asked_discover.result()
        lists = {name: task.result() for name, task in asked.items()}
        late = [
            k for k in LIST_KINDS if _advertises(discover, k.capability) and k.name not in lists
        ]
        found = await asyncio.gather(
            *(self._optional_list(backend, replica, k, previous) for k in late)
        )
        lists.update(zip((k.name for k in late), found, strict=True))
        kept = {
            k.name: lists[k.name] if _advertises(discover, k.capability) else {} for k in LIST_KINDS
        }
        return BackendView(
            discover=discover,
            tools=asked_tools.result(),
            fetched_at=time.monotonic(),
            prompts=kept["prompts"],
            resources=kept["resources"],
            templates=kept["templates"],
        )

    async def _optional_list(
        self, backend: Backend, replica: Replica, kind: ListKind, previous: BackendView | None
    ) -> dict[str, dict[str, Any]]:
        try:
            return await self._read_list(backend, replica, kind.method, kind.field, kind.key)
        except UpstreamCallError as exc:
            kept: dict[str, dict[str, Any]] = getattr(previous, kind.name) if previous else {}
            log.warning(
                "backend %r: %s failed, keeping the %d items last seen: %s",
                backend.name,
                kind.method,
                len(kept),
                exc,
            )
            return kept

    async def _read_list(
        self, backend: Backend, replica: Replica, method: str, field: str, key: str
    ) -> dict[str, dict[str, Any]]:
        """Every item of every page of `method`, by its `key`, the first of duplicates kept."""
        items: dict[str, dict[str, Any]] = {}
        cursor: str | None = None
        for _page in range(MAX_LIST_PAGES):
            params = {"cursor": cursor} if cursor is not None else {}
            result = await call(
                self._session,
                replica,
                method,
                params,
                timeout_s=DISCOVERY_TIMEOUT_S,
                headers=backend.credentials,
            )
            found = result.get(field)
            for item in found if isinstance(found, list) else ():
                if isinstance(item, dict) and isinstance(item.get(key), str):
                    items.setdefault(item[key], item)
            # An absent nextCursor ends the list; "" is a cursor like any other.
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str):
                return items
        log.warning(
            "backend %r: %s has more than %d pages; the rest is left out",
            backend.name,
            method,
            MAX_LIST_PAGES,
        )
        return items


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


def _advertises(discover: dict[str, Any], capability: str) -> bool:
    capabilities = discover.get("capabilities")
    # Present and not null/false: the core's shape is an object, but `true` is read as a yes.
    return isinstance(capabilities, dict) and capabilities.get(capability) not in (None, False)


def _subscribes(discover: dict[str, Any]) -> bool:
    capabilities = discover.get("capabilities")
    resources = capabilities.get("resources") if isinstance(capabilities, dict) else None
    return isinstance(resources, dict) and bool(resources.get("subscribe"))


def may_push_tasks(view: BackendView) -> bool:
    """Whether a backend may push notifications/tasks on a listen: it declares the Tasks
    extension and says it serves subscriptions/listen. The core has no capability for the
    latter; a server that serves it says `listChanged: true` or `resources.subscribe: true`
    (the MCP SDK's MCPServer does), one that does not says neither (FastMCP 4.1.4). A backend
    this misjudges is polled, which is always correct, or asked once in vain."""
    if TASKS_EXTENSION not in _extensions(view):
        return False
    capabilities = view.discover.get("capabilities")
    if not isinstance(capabilities, dict):
        return False
    return any(
        isinstance(entry, dict)
        and (entry.get("listChanged") is True or entry.get("subscribe") is True)
        for entry in capabilities.values()
    )


def _speaks(view: BackendView, version: str) -> bool:
    versions = view.discover.get("supportedVersions")
    return not isinstance(versions, list) or version in versions


def _extensions(view: BackendView) -> dict[str, Any]:
    capabilities = view.discover.get("capabilities")
    if isinstance(capabilities, dict) and isinstance(capabilities.get("extensions"), dict):
        return capabilities["extensions"]  # type: ignore[no-any-return]
    return {}
