"""What taskgate knows of its backends: their tools and capabilities, kept fresh."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gateway import __version__
from gateway.errors import Retryable
from gateway.protocol.meta import SERVER_INFO_KEY, SUPPORTED_VERSIONS, TASKS_EXTENSION
from gateway.routing.replicas import Backend
from gateway.routing.table import RouteTable
from gateway.upstream import UpstreamCallError, call

log = logging.getLogger("taskgate.discovery")

MAX_TOOL_PAGES = 100  # a backend that pages forever must not hold a refresh forever
DISCOVERY_TIMEOUT_S = 5.0
SERVER_INFO = {"name": "taskgate", "version": __version__}


@dataclass(frozen=True, slots=True)
class BackendView:
    """One backend as last seen: its discover result and its tools, by name."""

    discover: dict[str, Any]
    tools: dict[str, dict[str, Any]]
    fetched_at: float


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
        min_retry_s: float = 1.0,
    ) -> None:
        self._session = session
        self._backends = backends
        self._table = table
        self._refresh_s = refresh_s
        self._min_retry_s = min_retry_s
        self._slots = {name: _Slot() for name in backends}

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
        views = (await self.views()).values()
        versions = [v for v in SUPPORTED_VERSIONS if all(_speaks(view, v) for view in views)]
        extensions: dict[str, Any] = {}
        if any(TASKS_EXTENSION in _extensions(view) for view in views):
            extensions[TASKS_EXTENSION] = {}
        capabilities: dict[str, Any] = {"tools": {"listChanged": False}}
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

    def _stale(self, view: BackendView) -> bool:
        return time.monotonic() - view.fetched_at >= self._refresh_s

    def _refresh_later(self, backend: str, slot: _Slot) -> None:
        if slot.background is None or slot.background.done():
            slot.background = asyncio.create_task(self._refresh(backend, slot))

    async def _refresh(
        self, backend: str, slot: _Slot, *, force: bool = False
    ) -> BackendView | None:
        """The slot's view, fetched anew when stale (or when forced and not fetched just now)."""
        async with slot.lock:
            now = time.monotonic()
            view = slot.view
            fresh = view is not None and not self._stale(view)
            if (fresh and not force) or now - slot.last_attempt < self._min_retry_s:
                return view
            slot.last_attempt = now
            try:
                slot.view = await self._fetch(self._backends[backend])
            except UpstreamCallError as exc:
                log.warning("cannot refresh backend %r: %s", backend, exc)
            return slot.view

    async def _fetch(self, backend: Backend) -> BackendView:
        """Ask the replicas in turn until one answers discover and tools/list."""
        failure: UpstreamCallError | None = None
        for _ in backend.replicas:
            replica = backend.pick()
            try:
                discover = await call(
                    self._session,
                    replica,
                    "server/discover",
                    timeout_s=DISCOVERY_TIMEOUT_S,
                    headers=backend.credentials,
                )
                tools: dict[str, dict[str, Any]] = {}
                cursor: str | None = None
                for _page in range(MAX_TOOL_PAGES):
                    params = {"cursor": cursor} if cursor is not None else {}
                    page = await call(
                        self._session,
                        replica,
                        "tools/list",
                        params,
                        timeout_s=DISCOVERY_TIMEOUT_S,
                        headers=backend.credentials,
                    )
                    for tool in page.get("tools") or []:
                        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                            tools.setdefault(tool["name"], tool)
                    # An absent nextCursor ends the list; "" is a cursor like any other.
                    cursor = page.get("nextCursor")
                    if not isinstance(cursor, str):
                        break
                return BackendView(discover=discover, tools=tools, fetched_at=time.monotonic())
            except UpstreamCallError as exc:
                failure = exc
        assert failure is not None  # a backend has at least one replica
        raise failure


def _speaks(view: BackendView, version: str) -> bool:
    versions = view.discover.get("supportedVersions")
    return not isinstance(versions, list) or version in versions


def _extensions(view: BackendView) -> dict[str, Any]:
    capabilities = view.discover.get("capabilities")
    if isinstance(capabilities, dict) and isinstance(capabilities.get("extensions"), dict):
        return capabilities["extensions"]  # type: ignore[no-any-return]
    return {}
