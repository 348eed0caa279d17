"""The Redis durability policies hold back a route until the server says it is safe."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.app import open_store
from gateway.config import StoreConfig
from gateway.errors import StartupError
from gateway.store.base import Recorded, StoreUnavailable
from gateway.store.redis import RedisStore
from tests.store.test_contract import route
from tests.support.procs import RedisProcess


@pytest.fixture
def primary_with_replica() -> Iterator[RedisProcess]:
    with RedisProcess() as primary:
        replica = RedisProcess(extra_args=("--replicaof", "127.0.0.1", str(primary.port)))
        with replica:
            client = primary.client()
            try:
                # WAIT blocks until the replica has acknowledged a write: the link is up then.
                client.set("taskgate-test:sync", "1")
                if client.execute_command("WAIT", 1, 30_000) < 1:
                    pytest.fail("the replica never synchronised with its primary")
            finally:
                client.close()
            yield primary


async def test_wait_replicas_fails_closed_without_enough_replicas(redis_url: str) -> None:
    store = RedisStore(redis_url, timeout_s=2, wait_replicas=1, wait_timeout_ms=100)
    try:
        with pytest.raises(StoreUnavailable):
            await store.record(route())
    finally:
        await store.close()


async def test_wait_replicas_records_once_a_replica_acknowledges(
    primary_with_replica: RedisProcess,
) -> None:
    store = RedisStore(primary_with_replica.url, timeout_s=2, wait_replicas=1, wait_timeout_ms=2000)
    try:
        written = route()
        assert await store.record(written) is Recorded.INSERTED
        assert await store.lookup("task-1") == written
    finally:
        await store.close()


async def test_wait_aof_is_refused_at_start_on_a_redis_without_waitaof(
    redis_server: RedisProcess, tmp_path: Path
) -> None:
    version = redis_server.client().info("server")["redis_version"]
    if tuple(int(p) for p in version.split(".")[:2]) >= (7, 2):
        pytest.fail(f"this test expects Debian's Redis 7.0 (found {version}); adapt it")
    config = StoreConfig(url=redis_server.url, durability="wait_aof")
    with pytest.raises(StartupError, match="WAITAOF"):
        await open_store(config)
