"""redis-py's own client for a parsed store URL: Redis, a Sentinel service's master, a cluster."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis._parsers import AsyncCommandsParser
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel

from gateway.store import redis_tls
from gateway.store.redis_url import ClusterURL, RedisURL, SentinelURL

# Idle pooled connections are checked before use after this long: a server or a proxy that
# dropped them silently costs a PING, not a failed request.
HEALTH_CHECK_INTERVAL_S = 30

# store.max_connections: the store operations one process runs at once, each on a pooled
# connection of its own (a pool of that many; of a cluster, one such pool per node); one more
# waits for a free one (RedisLink.guard). By default the requests in flight
# (listen.max_in_flight) plus what reads the store outside their slots (/readyz, a 2025-era GET
# stream opening and looking at its session), up to a cap: Redis runs commands one at a time,
# so connections past a few hundred add no throughput, only clients counted against its
# maxclients (10,000 by default) for every worker of every instance.
OUTSIDE_SLOTS_CONNECTIONS = 16
DEFAULT_MAX_CONNECTIONS = 256


def default_max_connections(max_in_flight: int) -> int:
    """store.max_connections when the configuration sets none."""
    return min(max_in_flight + OUTSIDE_SLOTS_CONNECTIONS, DEFAULT_MAX_CONNECTIONS)


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """PEM files for TLS: the CA that signed the servers' certificates (None: the system's
    trusted CAs), and a client certificate and key for servers that ask for one."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def check(self) -> None:
        """ValueError naming the file when one cannot be read or the key does not fit the
        certificate: found at start, not at each connection attempt."""
        context = ssl.create_default_context()
        try:
            if self.ca_file is not None:
                context.load_verify_locations(cafile=self.ca_file)
        except (OSError, ValueError) as unusable_ca:
            raise ValueError(f"ca_file {self.ca_file}: {_said(unusable_ca)}") from None
        try:
            if self.cert_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ValueError) as unusable_cert:
            raise ValueError(
                f"cert_file {self.cert_file} / key_file {self.key_file}: {_said(unusable_cert)}"
            ) from None

    def ssl_options(self) -> dict[str, Any]:
        """redis-py's keyword arguments for these files (verification always on)."""
        options: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
        if self.ca_file is not None:
            options["ssl_ca_certs"] = self.ca_file
        if self.cert_file is not None:
            options["ssl_certfile"] = self.cert_file
        if self.key_file is not None:
            options["ssl_keyfile"] = self.key_file
        return options


class _CommandTable(AsyncCommandsParser):
    """redis-py's table of where each command's keys are, read once.

    redis-py reads it again (COMMAND) at every re-discovery of a cluster's slots, from its
    default node: the first master of its slot map, which can be a master that died while the
    cluster has not promoted its replica. Then every re-discovery fails before it is done, and
    the operations on the healthy masters fail with it (bench/scale.py: hundreds of creations
    refused with "cannot connect" to the dead master). The table does not change with a
    failover.
    """

    __slots__ = ()

    async def initialize(self, node: ClusterNode | None = None) -> None:
        if node is not None:
            self.node = node
        if not self.commands:
            await super().initialize()


@dataclass(frozen=True, slots=True)
class Clients:
    """The client a store talks through, its pool's size (of a cluster, per node), and the
    Sentinel clients that close with it."""

    main: aioredis.Redis | RedisCluster
    max_connections: int
    sentinels: tuple[aioredis.Redis, ...] = ()

    @property
    def cluster(self) -> RedisCluster | None:
        return self.main if isinstance(self.main, RedisCluster) else None

    async def close(self) -> None:
        try:
            await self.main.aclose()
            cluster = self.cluster
            if cluster is not None:
                # redis-py's aclose does nothing while a re-discovery of the slots is pending
                # (after any lost connection): what it would close is closed here, the nodes'
                # connections and the seed nodes' (which it keeps apart).
                await cluster.nodes_manager.aclose()
                await cluster.nodes_manager.aclose("startup_nodes")
        finally:
            for sentinel in self.sentinels:
                await sentinel.aclose()


def open_clients(
    target: RedisURL,
    tls: TLSFiles | None,
    *,
    socket_timeout: float,
    connect_timeout: float,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> Clients:
    """The redis-py client for `target`, with `max_connections` pooled (of a cluster, to each
    node); nothing connects until the first command."""
    timeouts: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
    }
    secure = (tls or TLSFiles()).ssl_options() if target.tls else {}
    if target.tls:
        redis_tls.install()  # one context per set of files, not one per connection
    if isinstance(target, ClusterURL):
        cluster = RedisCluster(
            startup_nodes=[
                ClusterNode(host, port, max_connections=max_connections)
                for host, port in target.nodes
            ],
            max_connections=max_connections,
            username=target.username,
            password=target.password,
            health_check_interval=HEALTH_CHECK_INTERVAL_S,
            ssl=target.tls,
            **timeouts,
            **secure,
        )
        cluster.commands_parser = _CommandTable()
        return Clients(cluster, max_connections)
    if isinstance(target, SentinelURL):
        # The sentinels are asked without the data nodes' password; over TLS when they are.
        sentinel = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
            list(target.sentinels),
            sentinel_kwargs={**timeouts, **({"ssl": True, **secure} if target.tls else {})},
            username=target.username,
            password=target.password,
            db=target.db,
            health_check_interval=HEALTH_CHECK_INTERVAL_S,
            max_connections=max_connections,
            **({"ssl": True, **secure} if target.tls else {}),
            **timeouts,
        )
        main: aioredis.Redis = sentinel.master_for(target.service)
        return Clients(main, max_connections, tuple(sentinel.sentinels))
    client = aioredis.Redis.from_url(
        target.url,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        max_connections=max_connections,
        **timeouts,
        **secure,
    )
    # redis-py lets the URL's own ?max_connections= win: the pool it made is the one to count.
    return Clients(client, client.connection_pool.max_connections)


def _said(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)
