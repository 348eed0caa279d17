"""The compiled route table: (tool, tenant) -> route, the first matching visible route wins."""

from __future__ import annotations

import fnmatch
import re
from collections import OrderedDict
from dataclasses import dataclass

from gateway.config import RouteConfig

_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True, slots=True)
class Route:
    index: int  # position in the YAML, which is also its precedence
    backend: str
    tools: tuple[str, ...]
    tenants: frozenset[str] | None = None  # None: every tenant sees the route
    scopes: tuple[str, ...] = ()  # what a token needs to call it

    def visible_to(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants


class RouteTable:
    """Exact names in a dict, globs compiled once; the routes matching a name are memoised in a
    bounded LRU, so a lookup is a dict hit plus a scan of the (few) routes naming that tool."""

    def __init__(self, routes: tuple[RouteConfig, ...], *, memo_size: int = 4096) -> None:
        self.routes = tuple(
            Route(
                index=i,
                backend=r.backend,
                tools=r.tools,
                tenants=frozenset(r.tenants) if r.tenants is not None else None,
                scopes=r.scopes,
            )
            for i, r in enumerate(routes)
        )
        self._exact: dict[str, list[Route]] = {}
        self._globs: list[tuple[re.Pattern[str], Route]] = []
        for route in self.routes:
            for tool in route.tools:
                if _GLOB_CHARS.isdisjoint(tool):
                    self._exact.setdefault(tool, []).append(route)
                else:
                    self._globs.append((re.compile(fnmatch.translate(tool)), route))
        self._memo: OrderedDict[str, tuple[Route, ...]] = OrderedDict()
        self._memo_size = memo_size

    def lookup(self, tool: str, tenant: str) -> Route | None:
        """The route serving `tool` to `tenant`, or None when no route exposes it to them."""
        for route in self._matching(tool):
            if route.visible_to(tenant):
                return route
        return None

    def _matching(self, tool: str) -> tuple[Route, ...]:
        found = self._memo.get(tool)
        if found is not None:
            self._memo.move_to_end(tool)
            return found
        routes = {route.index: route for route in self._exact.get(tool, ())}
        for pattern, route in self._globs:
            if pattern.fullmatch(tool):
                routes.setdefault(route.index, route)
        found = tuple(routes[i] for i in sorted(routes))
        self._memo[tool] = found
        if len(self._memo) > self._memo_size:
            self._memo.popitem(last=False)
        return found

    def backends(self) -> list[str]:
        """Backends some route points to, in order of first appearance."""
        return list(dict.fromkeys(route.backend for route in self.routes))
