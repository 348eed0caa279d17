"""A bounded in-process cache of found routes, keyed by owner: safe because routes are
insert-only, and keyed by owner so that another caller's lookup costs what an unknown id does."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from gateway.store.base import TaskRoute, now_ms

OwnerKey = tuple[str, str, str]  # tenant, principal, task id


class RouteCache:
    """Serves a found route to its owner until its expiry; "not found" is never cached."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._routes: OrderedDict[OwnerKey, TaskRoute] = OrderedDict()
        self.expired = 0  # routes found here past their expiry, and dropped (/metrics)

    def get(self, tenant: str, principal: str, task_id: str) -> TaskRoute | None:
        key = (tenant, principal, task_id)
        route = self._routes.get(key)
        if route is None:
            return None
        if route.expires_at_ms <= now_ms():
            del self._routes[key]
            self.expired += 1
            return None
        self._routes.move_to_end(key)
        return route

    def put(self, route: TaskRoute) -> None:
        if self._size <= 0:
            return
        key = (route.tenant, route.principal, route.task_id)
        self._routes[key] = route
        self._routes.move_to_end(key)
        while len(self._routes) > self._size:
            self._routes.popitem(last=False)

    def moved(self, route: TaskRoute, ttl_ms: int | None, expires_at_ms: int) -> None:
        """The route's expiry moved in the store: follow it, or forget a route now expired."""
        key = (route.tenant, route.principal, route.task_id)
        if key in self._routes:
            self._routes[key] = replace(route, ttl_ms=ttl_ms, expires_at_ms=expires_at_ms)

    def __len__(self) -> int:
        return len(self._routes)
