"""Redis topologies for the store tests: a cluster, a Sentinel group and a TLS server (and the
cluster and the Sentinel group on TLS), each started once per session on loopback and emptied
before every test that uses it; and `store`, every route store the contracts run on, with
`sessions`, the session store on each."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from gateway.store.base import TaskRouteStore
from gateway.store.limits import LimitStore
from gateway.store.questions import TaskQuestions
from gateway.store.redis_client import TLSFiles
from gateway.store.redis_routes import RedisRouteStore
from gateway.store.sessions import SessionStore
from gateway.store.sqlite_routes import SQLiteRouteStore
from tests.support.redis_topologies import (
    Certificates,
    ClusterGroup,
    SentinelGroup,
    StandaloneGroup,
    certificates,
)


@dataclass(frozen=True)
class StoreTarget:
    """What a RedisRouteStore is opened with: the URL and, for TLS, the files."""

    url: str
    tls: TLSFiles | None = None


def client_files(certs: Certificates) -> TLSFiles:
    """store.tls as an operator would write it: the CA, taskgate's certificate and key."""
    return TLSFiles(str(certs.ca), str(certs.client_cert), str(certs.client_key))


@pytest.fixture(scope="session")
def tls_certificates() -> Iterator[Certificates]:
    """One throwaway CA for every TLS topology of the session."""
    with certificates() as certs:
        yield certs


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterGroup]:
    """Three masters with a replica each (the replicas answer WAIT), asking for a password."""
    with ClusterGroup(masters=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def sentinel_group() -> Iterator[SentinelGroup]:
    """One master, one replica, three sentinels watching them as service "taskgate"."""
    with SentinelGroup() as group:
        yield group


@pytest.fixture(scope="session")
def tls_server(tls_certificates: Certificates) -> Iterator[StandaloneGroup]:
    """A redis-server on TLS that requires a client certificate."""
    with StandaloneGroup(tls=tls_certificates) as server:
        yield server


@pytest.fixture(scope="session")
def tls_cluster(tls_certificates: Certificates) -> Iterator[ClusterGroup]:
    """Three masters on TLS (clients, bus), no replicas."""
    with ClusterGroup(masters=3, tls=tls_certificates) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def tls_sentinel_group(tls_certificates: Certificates) -> Iterator[SentinelGroup]:
    """The Sentinel group with every node, sentinels included, on TLS."""
    with SentinelGroup(tls=tls_certificates) as group:
        yield group


@pytest.fixture
def cluster_target(redis_cluster: ClusterGroup) -> StoreTarget:
    redis_cluster.flushall()
    return StoreTarget(redis_cluster.url)


@pytest.fixture
def sentinel_target(sentinel_group: SentinelGroup) -> StoreTarget:
    sentinel_group.flushall()
    return StoreTarget(sentinel_group.url)


@pytest.fixture
def tls_target(tls_server: StandaloneGroup, tls_certificates: Certificates) -> StoreTarget:
    tls_server.flushall()
    return StoreTarget(tls_server.url, client_files(tls_certificates))


@pytest.fixture
def tls_cluster_target(tls_cluster: ClusterGroup, tls_certificates: Certificates) -> StoreTarget:
    tls_cluster.flushall()
    return StoreTarget(tls_cluster.url, client_files(tls_certificates))


@pytest.fixture
def tls_sentinel_target(
    tls_sentinel_group: SentinelGroup, tls_certificates: Certificates
) -> StoreTarget:
    tls_sentinel_group.flushall()
    return StoreTarget(tls_sentinel_group.url, client_files(tls_certificates))


# Each Redis topology by the fixture that empties it and says how to reach it.
TOPOLOGIES = {
    "redis-tls": "tls_target",
    "redis-sentinel": "sentinel_target",
    "redis-cluster": "cluster_target",
    "rediss-sentinel": "tls_sentinel_target",
    "rediss-cluster": "tls_cluster_target",
}


class Store(TaskRouteStore, Protocol):
    """What every route store is: a TaskRouteStore whose `sessions()` is the SessionStore,
    `questions()` the TaskQuestions and `limits()` the LimitStore on the same connection (mypy
    checks each store against these where `store` yields it)."""

    def sessions(self) -> SessionStore: ...

    def questions(self) -> TaskQuestions: ...

    def limits(self, max_tracked: int) -> LimitStore: ...


@pytest.fixture(params=["sqlite", "redis", *TOPOLOGIES])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "sqlite":
        sqlite = SQLiteRouteStore(tmp_path / "routes.db", timeout_s=2)
        await sqlite.open()
        yield sqlite
        await sqlite.close()
        return
    if request.param == "redis":
        target = StoreTarget(request.getfixturevalue("redis_url"))
    else:
        target = request.getfixturevalue(TOPOLOGIES[request.param])
    redis_store = RedisRouteStore(target.url, tls=target.tls, timeout_s=2)
    yield redis_store
    await redis_store.close()


@pytest.fixture
def questions(store: Store) -> TaskQuestions:
    """The task questions on `store`'s connection: every store their contract runs on."""
    return store.questions()


@pytest.fixture
def sessions(store: Store) -> SessionStore:
    """The session store on `store`'s connection: every store the session contract runs on."""
    return store.sessions()
