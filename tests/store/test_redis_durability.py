"""The Redis durability policies hold back a route until the server says it is safe."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.config import StoreConfig
from gateway.errors import StartupError, StoreUnavailable
from gateway.store.base import Recorded
from gateway.store.redis_routes import RedisRouteStore
from gateway.tasks.stores import open_store
from tests.store.test_contract import route
from tests.support.procs import RedisProcess


@pytest.fixture
def primary_with_replica() -> Iterator[RedisProcess]:
    # The replica is served at once, not after the 5 s a primary waits for more of them.
    with RedisProcess(extra_args=("--repl-diskless-sync-delay", "0")) as primary:
        replica = RedisProcess(extra_args=("--replicaof", "127.0.0.1", str(primary.port)))
        with replica:
            client = primary.client()
            try:
                # WAIT blocks until the replica has acknowledged a write: the link is up then.
                client.set("taskgate-test:sync", "1")
                synced = client.execute_command("WAIT", 1, 30_000)  # type: ignore[no-untyped-call]
                if synced < 1:
                    pytest.fail("the replica never synchronised with its primary")
            finally:
                client.close()
            yield primary


async def test_wait_replicas_fails_closed_without_enough_replicas(redis_url: str) -> None:
    store = RedisRouteStore(redis_url, timeout_s=2, wait_replicas=1, wait_timeout_ms=100)
    try:
        with pytest.raises(StoreUnavailable):
            await store.record(route())
    finally:
        await store.close()


async def test_wait_replicas_records_once_a_replica_acknowledges(
    primary_with_replica: RedisProcess,
) -> None:
    store = RedisRouteStore(
        primary_with_replica.url, timeout_s=2, wait_replicas=1, wait_timeout_ms=2000
    )
    try:
        written = route()
        assert await store.record(written) is Recorded.INSERTED
        assert await store.lookup("task-1") == written
    finally:
        await store.close()


def server_version(server: RedisProcess) -> tuple[int, ...]:
    with server.client() as client:
        version = str(client.info("server")["redis_version"])
    return tuple(int(part) for part in version.split(".")[:3])


async def test_wait_aof_is_refused_at_start_before_redis_7_2_and_holds_routes_from_it(
    redis_server: RedisProcess,
) -> None:
    # WAITAOF came with Redis 7.2. Each machine checks the side its own Redis is on (Debian 12
    # ships 7.0, later Debians 7.2 or newer); both sides are asserted, neither is skipped.
    with RedisProcess(aof=True) as server:
        version = server_version(server)
        config = StoreConfig(url=server.url, durability="wait_aof")
        if version < (7, 2):
            with pytest.raises(StartupError) as refused:
                await open_store(config)
            message = str(refused.value)
            assert message.startswith("store.durability: wait_aof needs Redis >= 7.2 (WAITAOF)")
            assert f"this server is {'.'.join(map(str, version))}." in message
            return
        store = await open_store(config)
        try:
            written = route()
            assert await store.record(written) is Recorded.INSERTED  # fsynced to the AOF
            assert await store.lookup(written.task_id) == written
        finally:
            await store.close()
    # On a server without an AOF nothing can be fsynced: every route fails closed.
    without_aof = await open_store(StoreConfig(url=redis_server.url, durability="wait_aof"))
    try:
        with pytest.raises(StoreUnavailable):
            await without_aof.record(route("task-2"))
    finally:
        await without_aof.close()
