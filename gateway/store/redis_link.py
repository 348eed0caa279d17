"""One process's connection to a Redis store, shared by the task routes and the 2025-era
sessions: redis-py's pooled clients, a permit per pooled connection, and the failure backoff
every operation obeys (one server, a Sentinel service's master, or each node of a cluster)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError, ResponseError, SlotNotCoveredError

from gateway.errors import RedisUnavailable, StoreUnavailable
from gateway.store.redis_client import DEFAULT_MAX_CONNECTIONS, TLSFiles, open_clients
from gateway.store.redis_errors import TOPOLOGY_ERRORS, explain, pool_exhausted
from gateway.store.redis_url import StandaloneURL, masked, parse_redis_url

T = TypeVar("T")

# What redis-py 8's asyncio clients raise from a connection that another caller's error handling
# closed under it (seen in a cluster master failover under load, bench/scale.py: HTTP 500s
# before): a transport already closed (RuntimeError), a writer already gone (AttributeError), a
# reset (OSError). A lost link like any other: a durable batch learns the layout again and is
# sent again; any operation that still meets one is the store unavailable (retryable).
BROKEN_LINK = (AttributeError, RuntimeError, OSError)

MIN_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0


class _Breaker:
    """The failure backoff of what operations go to: after a connection failure they fail at
    once until `retry_at`, for a backoff that doubles from MIN_BACKOFF_S up to MAX_BACKOFF_S.
    `node` names the cluster node it is for ("" for the store's own)."""

    __slots__ = ("backoff_s", "cause", "node", "retry_at")

    def __init__(self, node: str) -> None:
        self.node = node
        self.backoff_s = 0.0
        self.retry_at = 0.0
        self.cause = ""

    def refuses(self) -> bool:
        return time.monotonic() < self.retry_at

    def trip(self, cause: str) -> None:
        self.backoff_s = min(max(self.backoff_s * 2, MIN_BACKOFF_S), MAX_BACKOFF_S)
        self.retry_at = time.monotonic() + self.backoff_s
        self.cause = cause

    def close(self) -> None:
        self.backoff_s = 0.0
        self.retry_at = 0.0


class RedisLink:
    """redis-py's asyncio clients (hiredis parser when installed) for one store URL, pooled,
    and the one door Redis errors enter taskgate by (guard). The route store opens it and
    closes it; the session store uses the same one."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        tls: TLSFiles | None = None,
        wait_s: float = 0.0,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        """`wait_s`: what a durable write's WAIT/WAITAOF adds to an operation's deadline."""
        target = parse_redis_url(url)  # StoreURLError, a ValueError, when it names no Redis
        self._timeout_s = timeout_s + wait_s
        self._clients = open_clients(
            target,
            tls,
            socket_timeout=self._timeout_s,
            connect_timeout=timeout_s,
            max_connections=max_connections,
        )
        # One permit per pooled connection: an operation holds one while it runs (each uses one
        # connection at a time), so redis-py's pool never runs out, which it would answer at
        # once with "Too many connections"; the rest wait their turn, at most timeout_s.
        self._max_connections = self._clients.max_connections
        self._connections = asyncio.Semaphore(self._max_connections)
        self._connection_wait_s = timeout_s
        self.client = self._clients.main
        self.cluster = self._clients.cluster
        self._where = masked(url)
        self._tls = target.tls
        # A cause in a redis-py message never carries the password; scrubbed all the same.
        self._password = None if isinstance(target, StandaloneURL) else target.password
        # One backoff for a server or a Sentinel service's master. A cluster has one per node,
        # for the operations on the slots it serves (one dead master must not fail the others'
        # creations), and this one for what has no slot: a ping, the version, the slot map
        # while it is not known (_breaker_of).
        self._breaker = _Breaker("")
        self._node_breakers: dict[str, _Breaker] = {}

    @property
    def where(self) -> str:
        """The store's URL, its password masked."""
        return self._where

    async def ping(self) -> None:
        if self.cluster is None:
            await self.guard(self.client.ping())
            return
        info = await self.guard(self.cluster.cluster_info())
        state = str(info.get("cluster_state", "unknown"))
        if state != "ok":
            # Every keyed command would answer CLUSTERDOWN: the store cannot serve.
            raise self.unavailable(f"the cluster says cluster_state:{state}")

    async def server_version(self) -> tuple[int, ...]:
        """The Redis version; of a cluster, its oldest master's."""
        return min(_version(info) for info in (await self._masters_info("server")).values())

    async def without_aof(self) -> list[str]:
        """The masters whose AOF is off (INFO persistence says aof_enabled:0), which refuse
        WAITAOF: of a cluster their host:port, of one server (or a Sentinel service's master)
        "" for it. INFO, not CONFIG GET, which managed servers often disable."""
        infos = await self._masters_info("persistence")
        return [name for name, info in infos.items() if str(info.get("aof_enabled")) != "1"]

    async def _masters_info(self, section: str) -> dict[str, Any]:
        """INFO `section` of the server, by "", or of every master of a cluster, by name."""
        if self.cluster is None:
            return {"": await self.guard(self.client.info(section))}
        cluster = self.cluster
        await self.guard(cluster.initialize())
        return {
            node.name: await self.guard(cluster.info(section, target_nodes=node))
            for node in cluster.get_primaries()
        }

    async def close(self) -> None:
        await self._clients.close()

    async def guard(self, operation: Awaitable[T], key: str | None = None) -> T:
        """Redis errors enter the gateway here, as StoreUnavailable (retryable) naming the store
        and the cause (RedisUnavailable).

        After a connection failure, calls fail at once for a backoff that doubles up to
        MAX_BACKOFF_S: a Redis that is down is not hammered by every request, and clients get
        their retryable answer without waiting for a connect timeout each time. On a cluster
        the backoff is the node's that serves `key`'s slot, as redis-py's slot map says: a
        dead master fails the operations on its slots, not those of the masters that answer.

        An operation runs holding one of the `max_connections` pooled connections; when every
        one is in use it waits for one, at most store.timeout_s, so that a burst queues instead
        of failing. One that waited longer, or that redis-py's pool refused all the same, is
        refused as taskgate's own limit (`busy`), which never starts the backoff: the store did
        not fail, and other callers' operations must not fail for it.
        """
        breaker = self._breaker_of(key)
        if breaker.refuses():
            _discard(operation)
            raise self._reconnecting(breaker)
        try:
            taken = await self._take_connection()
        except BaseException:  # the caller was cancelled while it waited
            _discard(operation)
            raise
        if not taken:
            _discard(operation)
            raise self._busy(
                f"none of {self._max_connections} (store.max_connections) came free within "
                f"{self._connection_wait_s:g} s"
            )
        try:
            return await self._run(operation, key)
        finally:
            self._connections.release()

    async def _take_connection(self) -> bool:
        """One permit of the pool, waiting at most store.timeout_s; False when none came."""
        if not self._connections.locked():
            return await self._connections.acquire()  # at once, without a timer
        try:
            async with asyncio.timeout(self._connection_wait_s):
                return await self._connections.acquire()
        except TimeoutError:
            return False

    async def _run(self, operation: Awaitable[T], key: str | None) -> T:
        breaker = self._breaker_of(key)
        if breaker.refuses():  # it failed while this one waited for a connection
            _discard(operation)
            raise self._reconnecting(breaker)
        try:
            async with asyncio.timeout(self._timeout_s * 2):
                if self.cluster is not None:
                    await self._learn_slots(self.cluster, operation)
                    # The slot map may be new (the first call, a re-discovery): its owner now.
                    breaker = self._breaker_of(key)
                    if breaker.refuses():
                        _discard(operation)
                        raise self._reconnecting(breaker)
                result = await operation
        except StoreUnavailable:
            raise  # worded already: the server answered, not enough replicas did
        except (TimeoutError, RedisError, RedisClusterException) as exc:
            if pool_exhausted(exc):
                raise self._busy(
                    f"redis-py's pool of {self._max_connections} (store.max_connections) had "
                    "none free"
                ) from None
            cause = _on_node(breaker, explain(exc, tls=self._tls, timeout_s=self._timeout_s * 2))
            # A server that answered (a refused command) is up: no backoff for it.
            if not isinstance(exc, ResponseError) or isinstance(exc, TOPOLOGY_ERRORS):
                breaker.trip(cause)
            raise self.unavailable(cause) from None
        except BROKEN_LINK as broken:
            cause = _on_node(breaker, f"the connection broke ({type(broken).__name__}: {broken})")
            breaker.trip(cause)
            raise self.unavailable(cause) from None
        breaker.close()
        return result

    def _breaker_of(self, key: str | None) -> _Breaker:
        """The backoff an operation on `key` obeys and feeds: on a cluster, that of the node
        redis-py's slot map names for the key's slot; else (no key, no cluster, no slot map
        yet) the store's own."""
        cluster = self.cluster
        if cluster is None or key is None:
            return self._breaker
        try:
            node = cluster.get_node_from_key(key)
        except SlotNotCoveredError:  # no slot map yet, or none with this slot
            return self._breaker
        if node is None:  # only asked for a replica does redis-py answer None
            return self._breaker
        breaker = self._node_breakers.get(node.name)
        if breaker is None:
            breaker = self._node_breakers[node.name] = self._new_node_breaker(cluster, node.name)
        return breaker

    def _new_node_breaker(self, cluster: RedisCluster, name: str) -> _Breaker:
        """A node's backoff. The table holds the nodes redis-py knows: the names it forgot (a
        node replaced after a failover) are dropped once it would outgrow them."""
        known = cluster.get_nodes()
        if len(self._node_breakers) >= len(known):
            names = {node.name for node in known}
            for gone in [old for old in self._node_breakers if old not in names]:
                del self._node_breakers[gone]
        return _Breaker(name)

    @staticmethod
    async def _learn_slots(cluster: RedisCluster, operation: Awaitable[Any]) -> None:
        """The slot map, before `operation` runs: redis-py 8 routes a keyed command sent before
        it knows the slots as a keyless one (MOVED, and under concurrent callers a reset of
        every connection in use). A no-op after the first call and after each re-discovery;
        `operation` is closed if this fails."""
        try:
            await cluster.initialize()
        except BaseException:
            _discard(operation)
            raise

    def _reconnecting(self, breaker: _Breaker) -> RedisUnavailable:
        return self.unavailable(f"{breaker.cause} (reconnecting)")

    def unavailable(self, cause: str) -> RedisUnavailable:
        if self._password:
            cause = cause.replace(self._password, "***")
        return RedisUnavailable(self._where, cause)

    def _busy(self, cause: str) -> RedisUnavailable:
        return RedisUnavailable(self._where, cause, busy=True)


def _on_node(breaker: _Breaker, cause: str) -> str:
    """`cause`, naming the cluster node when the failure was that node's."""
    return f"{cause} (cluster node {breaker.node})" if breaker.node else cause


def _discard(operation: Awaitable[Any]) -> None:
    """An operation that will not run: a coroutine never awaited is closed, not warned of."""
    if inspect.iscoroutine(operation):
        operation.close()


def _version(info: Any) -> tuple[int, ...]:
    return tuple(int(part) for part in str(info["redis_version"]).split(".")[:3])


def as_text(value: Any) -> str:
    """A reply's bytes (or a number) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)
