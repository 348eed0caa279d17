"""The owner's read, on every store: another owner's route is answered as no route at all, so
that a foreign task id costs the read and the reply of an unknown one (THREAT_MODEL.md)."""

from __future__ import annotations

from dataclasses import replace

from redis.asyncio import Redis

from gateway.store.base import TaskRoute, TaskRouteStore, now_ms
from gateway.store.redis_routes import RedisRouteStore


def route(task_id: str = "task-1", tenant: str = "acme", principal: str = "alice") -> TaskRoute:
    created = now_ms()
    return TaskRoute(
        task_id, "reports", "http://127.0.0.1:9101/mcp", tenant, principal, created, 60_000,
        created + 60_000,
    )  # fmt: skip


async def test_the_owner_reads_its_route_as_written(store: TaskRouteStore) -> None:
    written = route()
    await store.record(written)
    assert await store.lookup_owned("task-1", "acme", "alice") == written


async def test_another_tenant_or_principal_reads_nothing_as_for_an_unknown_id(
    store: TaskRouteStore,
) -> None:
    await store.record(route())
    assert await store.lookup_owned("task-1", "globex", "alice") is None
    assert await store.lookup_owned("task-1", "acme", "mallory") is None
    assert await store.lookup_owned("never-recorded", "acme", "alice") is None


async def test_tenant_sharing_compares_the_tenant_only(store: TaskRouteStore) -> None:
    written = route()
    await store.record(written)
    assert await store.lookup_owned("task-1", "acme", None) == written
    assert await store.lookup_owned("task-1", "globex", None) is None


async def test_names_that_differ_only_past_a_prefix_or_in_unicode_are_other_owners(
    store: TaskRouteStore,
) -> None:
    await store.record(route("task-2", tenant="ac", principal="al"))
    await store.record(route("task-3", tenant="açme", principal="ålice"))
    assert await store.lookup_owned("task-2", "acme", "alice") is None
    assert await store.lookup_owned("task-2", "ac", "al") is not None
    assert await store.lookup_owned("task-3", "acme", "alice") is None
    assert await store.lookup_owned("task-3", "açme", "ålice") is not None


async def test_an_expired_route_is_read_by_nobody(store: TaskRouteStore) -> None:
    await store.record(replace(route(), expires_at_ms=now_ms() - 1))
    assert await store.lookup_owned("task-1", "acme", "alice") is None


async def test_redis_loads_the_owner_script_again_after_its_scripts_were_flushed(
    redis_url: str,
) -> None:
    """A restarted or failed-over server lacks the script: the read loads it and answers."""
    store = RedisRouteStore(redis_url, timeout_s=2)
    flusher = Redis.from_url(redis_url)
    try:
        written = route()
        await store.record(written)
        assert await store.lookup_owned("task-1", "acme", "alice") == written
        await flusher.script_flush()
        assert await store.lookup_owned("task-1", "acme", "alice") == written
        assert await store.lookup_owned("task-1", "globex", "bob") is None
    finally:
        await flusher.aclose()
        await store.close()
