"""taskgate's connections to a Redis store are a pool of its own: more operations at once than
it holds wait for a free connection instead of failing, a full pool is never taken for a store
outage (no backoff, other callers unaffected), and one that stays full is refused as taskgate's
limit, not as the store being unavailable (issue 23, item 2)."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest

from gateway.config import StoreConfig
from gateway.errors import BUSY_MESSAGE, CLIENT_MESSAGE, StoreUnavailable
from gateway.protocol.codes import Code
from gateway.store.base import Recorded, TaskRoute, now_ms
from gateway.store.keys import route_key
from gateway.store.redis_routes import RedisRouteStore
from gateway.tasks.stores import open_store
from tests.gateway.conftest import REPORT_TOOLS
from tests.gateway.test_tasks import create_report
from tests.store.conftest import TOPOLOGIES, StoreTarget
from tests.support.gateway import gateway_config, serving
from tests.support.mcp import build_request, post_raw
from tests.support.procs import BackendProcess, RedisProcess
from tests.support.redis_topologies import ClusterGroup

# More at once than redis-py's own pool holds (100; of a cluster, 100 per node: 300 over the
# three masters) and than taskgate's default pool (256).
BURST = 600

_ids = itertools.count(1)


@pytest.fixture(params=["redis", "redis-cluster", "redis-sentinel"])
def target(request: pytest.FixtureRequest) -> StoreTarget:
    """An emptied Redis of each topology whose client pools differently: one pool, one pool per
    cluster node, the pool of a Sentinel service's master."""
    if request.param == "redis":
        return StoreTarget(request.getfixturevalue("redis_url"))
    fixture: str = TOPOLOGIES[request.param]
    found: StoreTarget = request.getfixturevalue(fixture)
    return found


@pytest.fixture
async def redis_store(target: StoreTarget) -> AsyncIterator[RedisRouteStore]:
    """A store as taskgate opens it (the default pool), asked once already, as at start: a
    cluster client then knows the slots, and each operation goes straight to its node."""
    store = RedisRouteStore(target.url, tls=target.tls, timeout_s=2)
    await store.ping()
    yield store
    await store.close()


def route(task_id: str, tenant: str = "globex") -> TaskRoute:
    now = now_ms()
    return TaskRoute(
        task_id=task_id,
        backend="reports",
        replica="http://127.0.0.1:1/mcp",
        tenant=tenant,
        principal="bob",
        created_at_ms=now,
        ttl_ms=60_000,
        expires_at_ms=now + 120_000,
    )


async def burst_with_a_creation(store: RedisRouteStore, lookups: int) -> None:
    """`lookups` lookups of unknown ids at once, and another caller's route recorded in the
    middle of them: every lookup answers "not found", the route is recorded and found."""
    created = f"created-{uuid.uuid4().hex}"
    unknown = [store.lookup(uuid.uuid4().hex) for _ in range(lookups)]
    half = lookups // 2
    answers = await asyncio.gather(
        *unknown[:half], store.record(route(created)), *unknown[half:], return_exceptions=True
    )
    failures = [answer for answer in answers if isinstance(answer, BaseException)]
    assert not failures, f"{len(failures)} of {len(answers)} failed, first: {failures[0]}"
    assert answers[half] is Recorded.INSERTED
    assert [answer for index, answer in enumerate(answers) if index != half] == [None] * lookups
    found = await store.lookup(created)
    assert found is not None
    assert found.tenant == "globex"


def clients_of(server: RedisProcess) -> int:
    with server.client() as client:
        return int(client.info("clients")["connected_clients"])


async def test_more_operations_at_once_than_the_pool_holds_all_succeed_and_others_still_record(
    redis_store: RedisRouteStore,
) -> None:
    await burst_with_a_creation(redis_store, BURST)
    await redis_store.ping()


async def test_a_pool_of_three_serves_a_burst_by_turns(target: StoreTarget) -> None:
    store = RedisRouteStore(target.url, tls=target.tls, timeout_s=2, max_connections=3)
    try:
        await burst_with_a_creation(store, 200)
    finally:
        await store.close()


async def test_the_configured_bound_is_the_most_connections_taskgate_opens(
    redis_server: RedisProcess, redis_url: str
) -> None:
    before = clients_of(redis_server)
    store = await open_store(StoreConfig(url=redis_url, max_connections=5), max_in_flight=1000)
    assert isinstance(store, RedisRouteStore)
    try:
        await burst_with_a_creation(store, 200)
        assert 1 <= clients_of(redis_server) - before <= 5
    finally:
        await store.close()


async def test_by_default_the_bound_follows_listen_max_in_flight(
    redis_server: RedisProcess, redis_url: str
) -> None:
    before = clients_of(redis_server)
    # 4 requests in flight, plus 16 for what reads the store outside a request's slot.
    store = await open_store(StoreConfig(url=redis_url), max_in_flight=4)
    assert isinstance(store, RedisRouteStore)
    try:
        await burst_with_a_creation(store, 200)
        assert 1 <= clients_of(redis_server) - before <= 20
    finally:
        await store.close()


async def test_a_redis_url_of_its_own_max_connections_is_the_bound_it_waits_by(
    redis_server: RedisProcess, redis_url: str
) -> None:
    # redis-py reads the option from the URL and lets it win over store.max_connections.
    before = clients_of(redis_server)
    store = await open_store(StoreConfig(url=f"{redis_url}?max_connections=2"), max_in_flight=1000)
    assert isinstance(store, RedisRouteStore)
    try:
        await burst_with_a_creation(store, 200)
        assert 1 <= clients_of(redis_server) - before <= 2
    finally:
        await store.close()


async def test_a_pool_that_stays_full_is_taskgates_limit_and_starts_no_backoff(
    redis_url: str,
) -> None:
    # One connection, held for 2 s by a durable write whose WAIT no replica answers (this
    # server has none): a lookup waits store.timeout_s for it, then is refused.
    store = RedisRouteStore(
        redis_url, timeout_s=0.2, max_connections=1, wait_replicas=1, wait_timeout_ms=2000
    )
    try:
        await store.ping()

        async def refused_twice() -> list[StoreUnavailable]:
            refused = []
            for _ in range(2):
                with pytest.raises(StoreUnavailable) as caught:
                    await store.lookup(uuid.uuid4().hex)
                refused.append(caught.value)
            return refused

        # gather starts the write first: it takes the connection before the lookups ask.
        held, refusals = await asyncio.gather(
            store.record(route(f"held-{uuid.uuid4().hex}")), refused_twice(), return_exceptions=True
        )
        assert isinstance(held, StoreUnavailable)
        assert "reached 0 of 1 replicas" in str(held)
        assert isinstance(refusals, list)
        # The second was taskgate's limit too, not "unavailable (reconnecting)": the first
        # started no backoff.
        for error in refusals:
            assert (error.message, error.status, error.data) == (
                BUSY_MESSAGE,
                503,
                {"retryable": True},
            )
            assert error.headers == {"Retry-After": "1"}
            assert CLIENT_MESSAGE not in str(error)
            assert "none of 1 (store.max_connections) came free within 0.2 s" in str(error)
        assert await store.lookup(uuid.uuid4().hex) is None
    finally:
        await store.close()


# -- through taskgate -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Burst:
    """A store for taskgate, and the unknown task ids a client asks it about at once."""

    url: str
    task_ids: list[str]


@pytest.fixture(params=["redis", "redis-cluster"])
def burst(request: pytest.FixtureRequest) -> Burst:
    """Random ids; on a cluster, ids whose routes would all be on one master (random ids that
    happen to share a shard, the worst case of a cluster's per-node pools)."""
    if request.param == "redis":
        url: str = request.getfixturevalue("redis_url")
        return Burst(url, [uuid.uuid4().hex for _ in range(BURST)])
    cluster: ClusterGroup = request.getfixturevalue("redis_cluster")
    target: StoreTarget = request.getfixturevalue("cluster_target")
    candidates = [uuid.uuid4().hex for _ in range(4 * BURST)]
    owners = cluster.owners_of([route_key(task_id) for task_id in candidates])
    first = owners[route_key(candidates[0])]
    task_ids = [task_id for task_id in candidates if owners[route_key(task_id)] is first]
    assert len(task_ids) >= BURST, "a master holds about a third of the slots"
    return Burst(target.url, task_ids[:BURST])


async def tasks_get(http: aiohttp.ClientSession, url: str, task_id: str) -> tuple[int, int]:
    body = build_request("tasks/get", {"taskId": task_id}, id=next(_ids))
    answer = await post_raw(http, url, body)
    error = answer.message.get("error", {})
    return answer.status, int(error.get("code", 0))


async def test_a_burst_of_tasks_get_through_taskgate_is_not_found_never_503_and_creates_succeed(
    report_backends: list[BackendProcess], burst: Burst
) -> None:
    config = gateway_config(
        {"reports": [b.url for b in report_backends]},
        [(REPORT_TOOLS, "reports")],
        store=burst.url,
    )
    # One client keeps BURST tasks/get of random ids in flight (aiohttp's own limit is 100)
    # while another caller creates tasks, one after the other.
    async with (
        serving(config) as gateway,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client,
        aiohttp.ClientSession() as other,
    ):
        creating = asyncio.Event()

        async def probe(task_id: str) -> list[tuple[int, int]]:
            answers = [await tasks_get(client, gateway.url, task_id)]
            while creating.is_set():
                answers.append(await tasks_get(client, gateway.url, task_id))
            return answers

        creating.set()
        probes = [asyncio.create_task(probe(task_id)) for task_id in burst.task_ids]
        try:
            created = [await create_report(other, gateway.url) for _ in range(3)]
        finally:
            creating.clear()
            answers = [answer for probed in await asyncio.gather(*probes) for answer in probed]
        assert set(answers) == {(200, Code.INVALID_PARAMS)}, sorted(set(answers))
        assert len(answers) >= BURST
        for task_id in created:
            assert await gateway.state.tasks.store.lookup(task_id) is not None
        assert gateway.state.tasks.outcomes["store_down"] == 0
