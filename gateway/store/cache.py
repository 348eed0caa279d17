"""A bounded in-process cache of found routes: safe because routes are insert-only."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from gateway.store.base import Recorded, TaskRoute, TaskRouteStore, now_ms


class CachedStore:
    """Serves found routes from memory until their expiry; "not found" is never cached."""

    def __init__(self, inner: TaskRouteStore, *, size: int) -> None:
        self.inner = inner
        self._size = size
        self._routes: OrderedDict[str, TaskRoute] = OrderedDict()

    async def record(self, route: TaskRoute) -> Recorded:
        outcome = await self.inner.record(route)
        if outcome is not Recorded.CONFLICT:
            self._put(route)
        return outcome

    async def lookup(self, task_id: str) -> TaskRoute | None:
        route = self._routes.get(task_id)
        if route is not None:
            if route.expires_at_ms > now_ms():
                self._routes.move_to_end(task_id)
                return route
            del self._routes[task_id]
        route = await self.inner.lookup(task_id)
        if route is not None:
            self._put(route)
        return route

    async def refresh_expiry(self, task_id: str, ttl_ms: int | None, expires_at_ms: int) -> None:
        await self.inner.refresh_expiry(task_id, ttl_ms, expires_at_ms)
        cached = self._routes.get(task_id)
        if cached is not None:
            self._routes[task_id] = replace(cached, ttl_ms=ttl_ms, expires_at_ms=expires_at_ms)

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()

    def _put(self, route: TaskRoute) -> None:
        if self._size <= 0:
            return
        self._routes[route.task_id] = route
        self._routes.move_to_end(route.task_id)
        while len(self._routes) > self._size:
            self._routes.popitem(last=False)
