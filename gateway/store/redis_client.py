"""redis-py's own client for a parsed store URL: Redis, a Sentinel service's master, a cluster."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel

from gateway.store.redis_url import ClusterURL, RedisURL, SentinelURL

# Idle pooled connections are checked before use after this long: a server or a proxy that
# dropped them silently costs a PING, not a failed request.
HEALTH_CHECK_INTERVAL_S = 30


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


@dataclass(frozen=True, slots=True)
class Clients:
    """The client a store talks through, and the Sentinel clients that close with it."""

    main: aioredis.Redis | RedisCluster
    sentinels: tuple[aioredis.Redis, ...] = ()

    @property
    def cluster(self) -> RedisCluster | None:
        return self.main if isinstance(self.main, RedisCluster) else None

    async def close(self) -> None:
        try:
            await self.main.aclose()
        finally:
            for sentinel in self.sentinels:
                await sentinel.aclose()


def open_clients(
    target: RedisURL, tls: TLSFiles | None, *, socket_timeout: float, connect_timeout: float
) -> Clients:
    """The redis-py client for `target`; nothing connects until the first command."""
    timeouts: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
    }
    secure = (tls or TLSFiles()).ssl_options() if target.tls else {}
    if isinstance(target, ClusterURL):
        return Clients(
            RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
                username=target.username,
                password=target.password,
                health_check_interval=HEALTH_CHECK_INTERVAL_S,
                ssl=target.tls,
                **timeouts,
                **secure,
            )
        )
    if isinstance(target, SentinelURL):
        # The sentinels are asked without the data nodes' password; over TLS when they are.
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(target.sentinels),
            sentinel_kwargs={**timeouts, **({"ssl": True, **secure} if target.tls else {})},
            username=target.username,
            password=target.password,
            db=target.db,
            health_check_interval=HEALTH_CHECK_INTERVAL_S,
            **({"ssl": True, **secure} if target.tls else {}),
            **timeouts,
        )
        main: aioredis.Redis = sentinel.master_for(target.service)
        return Clients(main, tuple(sentinel.sentinels))
    return Clients(
        aioredis.Redis.from_url(
            target.url, health_check_interval=HEALTH_CHECK_INTERVAL_S, **timeouts, **secure
        )
    )


def _said(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)
