"""A store keeps working through a failover: its master is killed, a replica takes over, and the
routes recorded before (acknowledged by that replica) are found after; and before the failover,
a dead cluster master fails the routes of its own slots only. Each test has its own group: the
session's stay as they are."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import TypeVar

import pytest

from gateway.errors import CLIENT_MESSAGE, StoreUnavailable
from gateway.store.base import Recorded, TaskRoute
from gateway.store.keys import route_key
from gateway.store.redis_routes import RedisRouteStore
from tests.store.test_contract import route
from tests.support.procs import POLL_INTERVAL
from tests.support.redis_topologies import ClusterGroup, SentinelGroup, wait_until

T = TypeVar("T")
FAILOVER_WITHIN_S = 30.0


async def eventually(what: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """`attempt`'s result once it stops failing with StoreUnavailable, within the bound."""
    deadline = time.monotonic() + FAILOVER_WITHIN_S
    while True:
        try:
            return await attempt()
        except StoreUnavailable as exc:
            if time.monotonic() >= deadline:
                raise AssertionError(f"{what}: still failing after the failover: {exc}") from None
        await asyncio.sleep(POLL_INTERVAL)


@pytest.fixture
def sentinel_group() -> Iterator[SentinelGroup]:
    with SentinelGroup() as group:
        yield group


@pytest.fixture
def redis_cluster() -> Iterator[ClusterGroup]:
    with ClusterGroup(masters=3, replicas=1) as cluster:
        yield cluster


async def test_a_sentinel_store_follows_the_promoted_replica(
    sentinel_group: SentinelGroup,
) -> None:
    replica = sentinel_group.replica
    assert replica is not None
    store = RedisRouteStore(sentinel_group.url, timeout_s=2, wait_replicas=1, wait_timeout_ms=1000)
    after = RedisRouteStore(sentinel_group.url, timeout_s=2)  # no replica is left to wait for
    try:
        before = route("before-failover")
        assert await store.record(before) is Recorded.INSERTED
        sentinel_group.master.kill()
        wait_until(
            "the sentinels to promote the replica",
            lambda: sentinel_group.master_port() == replica.port,
            FAILOVER_WITHIN_S,
        )
        fresh = route("after-failover")
        assert await eventually("record", lambda: after.record(fresh)) is Recorded.INSERTED
        assert await after.lookup(before.task_id) == before
        assert await store.lookup(fresh.task_id) == fresh
    finally:
        await store.close()
        await after.close()


async def test_a_cluster_store_follows_a_failover_and_waits_again_once_the_old_master_rejoins(
    redis_cluster: ClusterGroup,
) -> None:
    durable = RedisRouteStore(redis_cluster.url, timeout_s=2, wait_replicas=1, wait_timeout_ms=1000)
    reader = RedisRouteStore(redis_cluster.url, timeout_s=2)
    try:
        written = [route(f"before-{i}") for i in range(30)]
        for one in written:
            assert await durable.record(one) is Recorded.INSERTED
        assert await reader.lookup(written[0].task_id) == written[0]
        victim = redis_cluster.owner_of(route_key(written[0].task_id))
        heir = redis_cluster.replica_of(victim)
        later = [route(f"after-{i}") for i in range(100)]
        owners = redis_cluster.owners_of([route_key(r.task_id) for r in later])
        moved = [r for r in later if owners[route_key(r.task_id)] is victim][:3]
        assert moved, "no later task id has a slot of the master to be killed"
        victim.kill()

        async def every_route() -> list[TaskRoute | None]:
            # Many callers at once while redis-py learns the new layout.
            return await asyncio.gather(*(reader.lookup(r.task_id) for r in written))

        assert await eventually("lookups", every_route) == written
        wait_until("the replica to be promoted", lambda: heir.role() == "master")
        # The old master comes back as the new one's replica. The durable store, which has not
        # been used since, still sends those slots to it: answered MOVED, it learns the new
        # layout and the heir's acknowledgement comes from its new replica.
        victim.restart()
        redis_cluster.wait_healthy(FAILOVER_WITHIN_S)
        assert victim.role() == "slave"
        for one in moved:
            outcome = await eventually("a durable record", partial(durable.record, one))
            assert outcome in (Recorded.INSERTED, Recorded.ALREADY)  # ALREADY: an earlier try
            assert await reader.lookup(one.task_id) == one
    finally:
        await durable.close()
        await reader.close()


@pytest.mark.parametrize("stop", ["SIGSTOP", "SIGKILL"])
async def test_a_dead_master_fails_only_the_routes_of_its_slots(
    redis_cluster: ClusterGroup, stop: str
) -> None:
    """Between a master's death and its replica's promotion, the store refuses the operations
    on that master's slots (after one has waited out the timeout, at once: the backoff), and
    records and looks up routes on the other masters as before: the backoff is the node's,
    not the store's (bench/scale.py measured what a store-wide one cost)."""
    for node in redis_cluster.nodes:
        # No node calls the dead master failed within the test: no failover, no CLUSTERDOWN.
        with node.client() as client:
            client.config_set("cluster-node-timeout", 60_000)
    store = RedisRouteStore(redis_cluster.url, timeout_s=1)
    victim = redis_cluster.primaries()[0]
    candidates = [route(f"shard-{i}") for i in range(300)]
    owners = redis_cluster.owners_of([route_key(r.task_id) for r in candidates])
    on_victim = [r for r in candidates if owners[route_key(r.task_id)] is victim][:10]
    elsewhere = [r for r in candidates if owners[route_key(r.task_id)] is not victim][:10]
    assert len(on_victim) == len(elsewhere) == 10, "300 ids did not spread over the masters"
    try:
        assert await store.record(route("before")) is Recorded.INSERTED  # the slot map known
        if stop == "SIGSTOP":
            os.kill(victim.pid, signal.SIGSTOP)  # it hangs: every call waits for the timeout
        else:
            victim.kill()  # its port refuses connections
        for dead, healthy in zip(on_victim, elsewhere, strict=True):
            with pytest.raises(StoreUnavailable) as refused:
                await store.record(dead)
            assert refused.value.message == CLIENT_MESSAGE  # the retryable store error
            assert f"(cluster node 127.0.0.1:{victim.port})" in str(refused.value)
            # Right after the dead master's failure, within its backoff:
            assert await store.record(healthy) is Recorded.INSERTED
            assert await store.lookup(healthy.task_id) == healthy
            with pytest.raises(StoreUnavailable):
                await store.lookup(dead.task_id)
    finally:
        if stop == "SIGSTOP":
            os.kill(victim.pid, signal.SIGCONT)
        await store.close()


async def test_a_dead_first_master_does_not_stop_redis_py_learning_the_slots_again(
    redis_cluster: ClusterGroup,
) -> None:
    """redis-py's cluster client reads its command table (COMMAND) from its default node, the
    master of slot 0, at every re-discovery of the slots. With that master dead and no
    failover yet, one lost connection to a healthy master (which starts a re-discovery) made
    every operation on every master fail with "cannot connect" to the dead one; taskgate
    keeps the table it read first."""
    for node in redis_cluster.nodes:
        with node.client() as client:
            client.config_set("cluster-node-timeout", 60_000)  # no failover within the test
    with redis_cluster.nodes[0].client() as client:
        layout = client.cluster("SLOTS")
    first = int(min(layout, key=lambda entry: int(entry[0]))[2][1])
    victim = next(node for node in redis_cluster.primaries() if node.port == first)
    healthy = [node for node in redis_cluster.primaries() if node is not victim]
    candidates = [route(f"first-{i}") for i in range(300)]
    owners = redis_cluster.owners_of([route_key(r.task_id) for r in candidates])
    store = RedisRouteStore(redis_cluster.url, timeout_s=2)
    try:
        assert await store.record(route("before")) is Recorded.INSERTED  # the slot map known
        victim.kill()
        with healthy[0].client() as client:
            assert client.client_kill_filter(_type="normal") >= 1  # taskgate's connections
        for master in healthy:
            on_it = [r for r in candidates if owners[route_key(r.task_id)] is master][:3]
            for one in on_it:
                assert await store.record(one) is Recorded.INSERTED
                assert await store.lookup(one.task_id) == one
        dead = next(r for r in candidates if owners[route_key(r.task_id)] is victim)
        with pytest.raises(StoreUnavailable):
            await store.record(dead)
    finally:
        await store.close()
