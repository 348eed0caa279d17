"""The compiled route table: tool name -> backend, first matching route wins."""

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


class RouteTable:
    """Exact names in a dict, globs compiled once; glob answers are memoised in a bounded LRU."""

    def __init__(self, routes: tuple[RouteConfig, ...], *, memo_size: int = 4096) -> None:
        self.routes = tuple(
            Route(index=i, backend=r.backend, tools=r.tools) for i, r in enumerate(routes)
        )
        self._exact: dict[str, Route] = {}
        self._globs: list[tuple[re.Pattern[str], Route]] = []
        for route in self.routes:
            for tool in route.tools:
                if _GLOB_CHARS.isdisjoint(tool):
                    self._exact.setdefault(tool, route)
                else:
                    self._globs.append((re.compile(fnmatch.translate(tool)), route))
        self._memo: OrderedDict[str, Route | None] = OrderedDict()
        self._memo_size = memo_size

    def lookup(self, tool: str) -> Route | None:
        """The route serving `tool`, or None when no route exposes it."""
        if tool in self._memo:
            self._memo.move_to_end(tool)
            return self._memo[tool]
        found = self._exact.get(tool)
        for pattern, route in self._globs:
            if found is not None and found.index <= route.index:
                break
            if pattern.fullmatch(tool):
                found = route
                break
        self._memo[tool] = found
        if len(self._memo) > self._memo_size:
            self._memo.popitem(last=False)
        return found

    def backends(self) -> list[str]:
        """Backends some route points to, in order of first appearance."""
        return list(dict.fromkeys(route.backend for route in self.routes))
