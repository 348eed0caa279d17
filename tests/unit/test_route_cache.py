"""The route cache answers owners only, never past expiry, within its bound; the router refuses
every id its caller may not use with the one answer, whatever the cache holds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from gateway.auth import Principal
from gateway.config import TasksConfig
from gateway.errors import TaskNotFound
from gateway.store.base import TaskRoute, now_ms
from gateway.store.cache import RouteCache
from gateway.store.sqlite_routes import SQLiteRouteStore
from gateway.tasks.routes import TaskRouter
from gateway.upstream.pool import Pool


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


@pytest.fixture
async def router() -> AsyncIterator[TaskRouter]:
    """The task router on a real (in-memory) SQLite store, the route cache on."""
    store = SQLiteRouteStore(":memory:", timeout_s=2)
    await store.open()
    pool = Pool()
    yield TaskRouter(store, TasksConfig(), pool)
    await pool.close()
    await store.close()


async def refusal(router: TaskRouter, task_id: str, caller: Principal) -> bytes:
    with pytest.raises(TaskNotFound) as refused:
        await router.resolve(task_id, caller, 7)
    return refused.value.body()


async def test_a_route_cached_for_its_owner_is_refused_to_others_as_an_unknown_id_is(
    router: TaskRouter,
) -> None:
    await router.store.record(route())
    owner = Principal("acme", "alice")
    assert (await router.resolve("t1", owner, 1)).replica == "http://r1/mcp"
    assert len(router.cache) == 1  # warm: the owner's route is in this process's cache
    unknown = await refusal(router, "never-recorded", Principal("globex", "bob"))
    for caller in (Principal("globex", "bob"), Principal("acme", "mallory")):
        for _ in range(2):  # asked again: nothing about either id was kept for the caller
            assert await refusal(router, "t1", caller) == unknown
            assert await refusal(router, "never-recorded", caller) == unknown
    assert len(router.cache) == 1
    assert router.outcomes["not_found"] == 9
    assert router.outcomes["found"] == 1


async def test_owner_names_beyond_ascii_are_compared_and_never_fail_the_request(
    router: TaskRouter,
) -> None:
    await router.store.record(route(tenant="açme", principal="ålice"))
    unknown = await refusal(router, "never-recorded", Principal("acme", "alice"))
    assert await refusal(router, "t1", Principal("acme", "alice")) == unknown
    assert await refusal(router, "t1", Principal("açme", "alice")) == unknown
    assert (await router.resolve("t1", Principal("açme", "ålice"), 1)).tenant == "açme"


async def test_tenant_sharing_lets_the_tenant_in_and_keeps_other_tenants_out(
    router: TaskRouter,
) -> None:
    router.reconfigure(TasksConfig(), sharing="tenant")
    await router.store.record(route())
    assert (await router.resolve("t1", Principal("acme", "bob"), 1)).principal == "alice"
    unknown = await refusal(router, "never-recorded", Principal("globex", "alice"))
    assert await refusal(router, "t1", Principal("globex", "alice")) == unknown
