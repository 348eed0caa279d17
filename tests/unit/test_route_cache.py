"""The route cache answers owners only, never past expiry, within its bound."""

from __future__ import annotations

from dataclasses import replace

from gateway.store.base import TaskRoute, now_ms
from gateway.store.cache import RouteCache


def route(task_id: str = "t1", tenant: str = "acme", principal: str = "alice") -> TaskRoute:
    now = now_ms()
    return TaskRoute(
        task_id, "reports", "http://r1/mcp", tenant, principal, now, 1000, now + 60_000
    )


def test_a_cached_route_is_served_to_its_owner() -> None:
    cache = RouteCache(10)
    cache.put(route())
    found = cache.get("acme", "alice", "t1")
    assert found is not None
    assert (found.task_id, found.replica) == ("t1", "http://r1/mcp")


def test_another_tenant_or_principal_misses_the_cache_like_an_unknown_id() -> None:
    cache = RouteCache(10)
    cache.put(route())
    assert cache.get("globex", "alice", "t1") is None
    assert cache.get("acme", "mallory", "t1") is None
    assert cache.get("acme", "alice", "t2") is None


def test_an_expired_route_is_never_served() -> None:
    cache = RouteCache(10)
    cache.put(replace(route(), expires_at_ms=now_ms() - 1))
    assert cache.get("acme", "alice", "t1") is None
    assert len(cache) == 0


def test_a_moved_expiry_is_followed() -> None:
    cache = RouteCache(10)
    cached = route()
    cache.put(cached)
    cache.moved(cached, 0, now_ms() - 1)
    assert cache.get("acme", "alice", "t1") is None


def test_the_cache_stays_within_its_bound_evicting_the_least_recently_used() -> None:
    cache = RouteCache(3)
    for i in range(3):
        cache.put(route(f"t{i}"))
    assert cache.get("acme", "alice", "t0") is not None  # t0 is now the most recent
    cache.put(route("t3"))
    assert len(cache) == 3
    assert cache.get("acme", "alice", "t1") is None
    assert cache.get("acme", "alice", "t0") is not None


def test_a_zero_size_cache_holds_nothing() -> None:
    cache = RouteCache(0)
    cache.put(route())
    assert cache.get("acme", "alice", "t1") is None
