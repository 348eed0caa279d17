"""Task routes in Redis: a hash per task, written by an insert-only script, expiring by itself;
and 2025-era sessions: a hash per session, counted per owner and in all."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from redis.asyncio.cluster import PipelineCommand, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import (
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.errors import StoreUnavailable
from gateway.store.base import Recorded, TaskRoute
from gateway.store.keys import (
    LEGACY_ALL_KEY,
    legacy_owner_key,
    legacy_session_key,
    legacy_session_prefix,
    route_key,
)
from gateway.store.redis_client import DEFAULT_MAX_CONNECTIONS, TLSFiles, open_clients
from gateway.store.redis_errors import (
    AOF_OFF,
    TOPOLOGY_ERRORS,
    RedisUnavailable,
    aof_off,
    explain,
    pool_exhausted,
)
from gateway.store.redis_url import StandaloneURL, masked, parse_redis_url
from gateway.store.sessions import (
    LegacySession,
    Opened,
    Opening,
    UpstreamSession,
    decode_record,
    decode_upstream,
    encode_record,
    encode_upstream,
)

T = TypeVar("T")

log = logging.getLogger("taskgate.store")

# What redis-py 8's asyncio clients raise from a connection that another caller's error handling
# closed under it (seen in a cluster master failover under load, bench/scale.py: HTTP 500s
# before): a transport already closed (RuntimeError), a writer already gone (AttributeError), a
# reset (OSError). A lost link like any other: a durable batch learns the layout again and is
# sent again; any operation that still meets one is the store unavailable (retryable).
_BROKEN_LINK = (AttributeError, RuntimeError, OSError)

MIN_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0
# A server that turned its AOF off refuses every WAITAOF: each creation fails (and logs so);
# the operator's line that names the fix comes at most this often, not once per request.
AOF_OFF_LOG_INTERVAL_S = 60.0

# Insert-only: a live hash is returned as it is, so the caller can tell "already mine" from
# "somebody else's"; only an absent key is written (a found one gets one field written again
# unchanged, for a durable write's WAIT to cover it: RedisStore._acknowledged).
_RECORD = """
local existing = redis.call('HGETALL', KEYS[1])
if #existing > 0 then
  redis.call('HSET', KEYS[1], existing[1], existing[2])
  return existing
end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIREAT', KEYS[1], ARGV[1])
return {}
"""
# A route for its owner only: ARGV[1] the tenant, ARGV[2] the principal, compared when ARGV[3]
# is '1'. Another owner's id and an absent one run the same HMGET and get the same empty reply,
# so that neither the reply nor the client's work on it tells them apart.
_LOOKUP_OWNED = """
local owner = redis.call('HMGET', KEYS[1], 'tenant', 'principal')
if owner[1] ~= ARGV[1] or (ARGV[3] == '1' and owner[2] ~= ARGV[2]) then return {} end
return redis.call('HGETALL', KEYS[1])
"""
# Only the expiry moves; a route that already expired is not brought back.
_REFRESH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'ttl_ms', ARGV[1], 'expires_at_ms', ARGV[2])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
return 1
"""

# Sessions are written without WAIT/WAITAOF whatever the durability policy: a session lost in a
# failover costs its client a 404 and a new initialize, which is the 2025 revisions' own recovery
# from a lost session; a task route lost would cost the task itself.
#
# A session's hash: "r" the record (encode_record), "e" its expiry, "u:<backend>" each upstream
# session (encode_upstream). Expiry is judged by the server's clock, as the hash's own expiry is,
# so that a member counted in a set is a hash that still exists. Lua's numbers are doubles,
# exact for milliseconds since 1970 for another 280,000 years.
_NOW_MS = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""
# The owner's count, its evictions and the write in one script on the owner's slot: the owner
# limit is exact, and a session is evicted only with the insert it makes room for. At the limit
# the owner's least recently used sessions go (lowest score: every use moves the expiry forward;
# ties by id, as SQLite breaks them), as many as leave max_per_owner with the new one; each is
# returned as its id and HGETALL's list, so the caller can end its upstream sessions. Their keys
# are built here from ARGV[5], the owner's key prefix: a script cannot declare keys it has yet to
# read, and these share the owner's hash tag, so its slot. An id opened again is replaced, not
# counted twice (nor counted at all by _COUNT_SESSIONS) nor evicted.
_OPEN_SESSION = (
    _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('(%d', now))
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[1])
local held = redis.call('ZCARD', KEYS[2])
local evicted = {}
while held >= tonumber(ARGV[3]) and held > 0 do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  local key = ARGV[5] .. oldest
  evicted[#evicted + 1] = oldest
  evicted[#evicted + 1] = redis.call('HGETALL', key)
  redis.call('DEL', key)
  redis.call('ZREM', KEYS[2], oldest)
  held = held - 1
end
redis.call('HSET', KEYS[1], 'r', ARGV[4], 'e', ARGV[2])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return evicted
"""
)
_COUNT_SESSIONS = (
    _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%d', now))
local live = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then live = live - 1 end
return live
"""
)
# First binder wins: HSETNX writes the backend's field only if no call wrote it before, and the
# field as it is after is the answer, so that every caller learns the winner without a re-read.
# HSETNX keeps the hash's expiry; only an absent hash must not be created here (nil: gone).
_BIND_UPSTREAM = """
if redis.call('EXISTS', KEYS[1]) == 0 then return nil end
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
return redis.call('HGET', KEYS[1], ARGV[1])
"""
_TOUCH_SESSION = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'e', ARGV[2])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], 'XX', ARGV[2], ARGV[1])
return 1
"""
_END_SESSION = """
local fields = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return fields
"""


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


class RedisStore:
    """A TaskRouteStore on redis-py's asyncio clients (hiredis parser when installed), pooled:
    one server, a Sentinel service's master, or a Redis Cluster, as the URL says."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        tls: TLSFiles | None = None,
        wait_replicas: int = 0,
        wait_aof: bool = False,
        wait_timeout_ms: int = 500,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        target = parse_redis_url(url)  # StoreURLError, a ValueError, when it names no Redis
        # A durable write waits for WAIT/WAITAOF on top of its own round trip.
        self._timeout_s = timeout_s + (wait_timeout_ms / 1000 if wait_aof or wait_replicas else 0)
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
        self._client = self._clients.main
        self._cluster = self._clients.cluster
        self._where = masked(url)
        self._tls = target.tls
        # A cause in a redis-py message never carries the password; scrubbed all the same.
        self._password = None if isinstance(target, StandaloneURL) else target.password
        self._wait_replicas = wait_replicas
        self._wait_aof = wait_aof
        self._wait_timeout_ms = wait_timeout_ms
        # One backoff for a server or a Sentinel service's master. A cluster has one per node,
        # for the operations on the slots it serves (one dead master must not fail the others'
        # creations), and this one for what has no slot: a ping, the version, the slot map
        # while it is not known (_breaker_of).
        self._breaker = _Breaker("")
        self._node_breakers: dict[str, _Breaker] = {}
        self._aof_off_logged_at = float("-inf")
        self._record = self._client.register_script(_RECORD)
        self._refresh = self._client.register_script(_REFRESH)
        self._lookup_owned = self._client.register_script(_LOOKUP_OWNED)
        self._open_session = self._client.register_script(_OPEN_SESSION)
        self._count_sessions = self._client.register_script(_COUNT_SESSIONS)
        self._bind_upstream = self._client.register_script(_BIND_UPSTREAM)
        self._touch_session = self._client.register_script(_TOUCH_SESSION)
        self._end_session = self._client.register_script(_END_SESSION)

    @property
    def where(self) -> str:
        """The store's URL, its password masked."""
        return self._where

    async def record(self, route: TaskRoute) -> Recorded:
        key = route_key(route.task_id)
        args = [route.expires_at_ms, *_fields(route)]
        if not self._wait_aof and self._wait_replicas == 0:
            existing = await self._guard(self._record(keys=[key], args=args), key)
        elif self._cluster is not None:
            batch = self._record_on_slot_master(self._cluster, key, args)
            existing = await self._guard(batch, key)
        else:
            existing = await self._guard(self._record_durably(key, args), key)
        if not existing:
            return Recorded.INSERTED
        found = _route(route.task_id, existing)
        return (
            Recorded.ALREADY if found is not None and found.same_owner(route) else Recorded.CONFLICT
        )

    async def _record_durably(self, key: str, args: list[Any]) -> Any:
        # WAIT/WAITAOF count the writes of their own connection: one pipeline, one connection
        # (to the master a Sentinel names, for redis+sentinel).
        client = self._client
        assert not isinstance(client, RedisCluster)  # a cluster's goes to the slot's master
        async with client.pipeline(transaction=False) as pipe:
            await self._record(keys=[key], args=args, client=pipe)
            pipe.execute_command(*self._wait_command())
            # Each reply as it is (an error too): WAITAOF's refusal in redis-py's pipeline
            # wording would hide what the server said.
            existing, acks = await pipe.execute(raise_on_error=False)
        if isinstance(existing, Exception):
            raise existing
        if isinstance(acks, Exception):
            raise self._wait_refused(acks, "")
        return self._acknowledged(existing, acks)

    async def _record_on_slot_master(self, cluster: RedisCluster, key: str, args: list[Any]) -> Any:
        """The script and its WAIT as one batch on one connection to the master of the route's
        slot, tried at most three times.

        Not through redis-py's cluster pipeline: a batch it retries after a connection error
        sends WAIT anew to whichever node it picks for a keyless command, and a WAIT on another
        connection than the write's counts nothing. When the batch meets a changed cluster
        (MOVED, CLUSTERDOWN, a node gone), a keyed read through the cluster client lets redis-py
        learn the new layout (its own MOVED handling and re-discovery), then the batch goes to
        the slot's master as it knows it now.
        """
        failure: BaseException | None = None
        for _ in range(3):
            await cluster.initialize()  # a no-op once the slots are known
            node = cluster.get_node_from_key(key)
            if node is None:  # only asked for a replica does redis-py answer None
                raise self._unavailable("no master serves the route's slot")
            batch = [
                PipelineCommand(0, "EVALSHA", self._record.sha, 1, key, *args),
                PipelineCommand(1, *self._wait_command()),
            ]
            try:
                await node.execute_pipeline(batch)
            except (RedisConnectionError, RedisTimeoutError, *_BROKEN_LINK) as lost:
                if pool_exhausted(lost):
                    raise  # no link was lost: the node's pool is full (see _guard)
                failure = lost
                await self._relearn(cluster, key)
                continue
            existing, acks = batch[0].result, batch[1].result
            if isinstance(existing, NoScriptError):
                await cluster.script_load(_RECORD)  # on every master
                failure = existing
            elif isinstance(existing, TOPOLOGY_ERRORS):
                failure = existing
                await self._relearn(cluster, key)
            elif isinstance(existing, Exception):
                raise existing
            elif isinstance(acks, Exception):
                raise self._wait_refused(acks, node.name)
            else:
                return self._acknowledged(existing, acks)
        assert failure is not None
        if isinstance(failure, RedisError):
            raise failure
        raise RedisConnectionError(f"the connection to the slot's master broke ({failure!r})")

    @staticmethod
    async def _relearn(cluster: RedisCluster, key: str) -> None:
        """Let redis-py find the slot's master again (it follows MOVED and re-reads the
        cluster's layout after CLUSTERDOWN or a lost node, with its own retries)."""
        with contextlib.suppress(RedisError, RedisClusterException):
            await cluster.exists(key)

    def _wait_command(self) -> tuple[Any, ...]:
        if self._wait_aof:
            return ("WAITAOF", 1, self._wait_replicas, self._wait_timeout_ms)
        return ("WAIT", self._wait_replicas, self._wait_timeout_ms)

    def _wait_refused(self, refused: Exception, node: str) -> Exception:
        """What to raise for a WAIT or WAITAOF the server (of a cluster, the master `node`)
        refused. A server with its AOF off refuses every WAITAOF: its creations fail closed
        with the retryable error all the same (the route is on the master, unacknowledged, and
        expires), and the operator is told the fix at most once per AOF_OFF_LOG_INTERVAL_S."""
        if not aof_off(refused):
            return refused
        server = f"the master {node}" if node else "it"
        now = time.monotonic()
        if now - self._aof_off_logged_at >= AOF_OFF_LOG_INTERVAL_S:
            self._aof_off_logged_at = now
            log.error(
                "the task store %s: %s, and %s has appendonly no (the server said: %s). "
                "store.durability is wait_aof: every task creation fails until it is on again "
                "(CONFIG SET appendonly yes, and appendonly yes in its configuration file). "
                "Logged at most once in %g s",
                self._where, AOF_OFF, server, refused, AOF_OFF_LOG_INTERVAL_S,
            )  # fmt: skip
        return self._unavailable(f"{AOF_OFF} ({server} has appendonly no)")

    def _acknowledged(self, existing: Any, acks: Any) -> Any:
        # Found or written, the route is confirmed only by this WAIT: a route found may be this
        # very write's, from an attempt whose link broke (redis-py sends a batch again on a new
        # connection) or whose wait failed. The script rewrites one field of a found route as
        # it is, so that this connection's WAIT covers it: replication is in order.
        local, replicas = (acks[0], acks[1]) if self._wait_aof else (1, acks)
        if local < 1 or replicas < self._wait_replicas:
            raise self._unavailable(
                f"the route reached {replicas} of {self._wait_replicas} replicas "
                f"(local fsync: {bool(local)}) within {self._wait_timeout_ms} ms"
            )
        return existing

    async def lookup(self, task_id: str) -> TaskRoute | None:
        key = route_key(task_id)
        fields = await self._guard(self._client.hgetall(key), key)
        return _route(task_id, fields) if fields else None

    async def lookup_owned(
        self, task_id: str, tenant: str, principal: str | None
    ) -> TaskRoute | None:
        args = (tenant, principal or "", "0" if principal is None else "1")
        key = route_key(task_id)
        fields = await self._guard(self._owned(key, args), key)
        return _route(task_id, fields) if fields else None

    async def _owned(self, key: str, args: tuple[str, str, str]) -> Any:
        # EVALSHA itself: the script object's call costs about 7 us more per lookup. A server
        # that lacks the script (restarted, failed over) gets it through the script object.
        try:
            return await self._client.evalsha(self._lookup_owned.sha, 1, key, *args)
        except NoScriptError:
            return await self._lookup_owned(keys=[key], args=args)

    async def refresh_expiry(self, task_id: str, ttl_ms: int | None, expires_at_ms: int) -> None:
        ttl = "" if ttl_ms is None else ttl_ms
        key = route_key(task_id)
        await self._guard(self._refresh(keys=[key], args=[ttl, expires_at_ms]), key)

    async def open_session(
        self, session: LegacySession, *, max_per_owner: int, max_total: int
    ) -> Opening:
        count = self._count_sessions(keys=[LEGACY_ALL_KEY], args=[session.session_id])
        live = await self._guard(count, LEGACY_ALL_KEY)
        if int(live) >= max_total:
            return Opening(Opened.STORE_FULL)
        owner = session.owner
        keys = _session_keys(owner, session.session_id)
        args: list[Any] = [
            session.session_id, session.expires_at_ms, max_per_owner, encode_record(session),
            legacy_session_prefix(owner),
        ]  # fmt: skip
        reply = await self._guard(self._open_session(keys=keys, args=args), keys[0])
        ids = [_text(session_id) for session_id in reply[::2]]
        evicted = [
            _legacy_session(session_id, owner, fields) if fields else None
            for session_id, fields in zip(ids, reply[1::2], strict=True)
        ]
        if ids:
            await self._in_all(self._client.zrem(LEGACY_ALL_KEY, *ids))
        await self._in_all(
            self._client.zadd(LEGACY_ALL_KEY, {session.session_id: session.expires_at_ms})
        )
        # A hash that expired at its very score, or that cannot be read, is gone all the same.
        return Opening(Opened.OPENED, tuple(ended for ended in evicted if ended is not None))

    async def session(self, session_id: str, owner: str) -> LegacySession | None:
        key = legacy_session_key(owner, session_id)
        fields = await self._guard(self._client.hgetall(key), key)
        return _legacy_session(session_id, owner, fields) if fields else None

    async def bind_upstream(
        self, session_id: str, owner: str, backend: str, upstream: UpstreamSession
    ) -> UpstreamSession | None:
        key = legacy_session_key(owner, session_id)
        args: list[Any] = [f"u:{backend}", encode_upstream(upstream)]
        bound = await self._guard(self._bind_upstream(keys=[key], args=args), key)
        return decode_upstream(bound) if bound is not None else None

    async def touch_session(self, session_id: str, owner: str, expires_at_ms: int) -> bool:
        keys = _session_keys(owner, session_id)
        args: list[Any] = [session_id, expires_at_ms]
        if not await self._guard(self._touch_session(keys=keys, args=args), keys[0]):
            return False
        await self._in_all(self._client.zadd(LEGACY_ALL_KEY, {session_id: expires_at_ms}, xx=True))
        return True

    async def end_session(self, session_id: str, owner: str) -> LegacySession | None:
        keys = _session_keys(owner, session_id)
        fields = await self._guard(self._end_session(keys=keys, args=[session_id]), keys[0])
        if not fields:
            return None
        await self._in_all(self._client.zrem(LEGACY_ALL_KEY, session_id))
        return _legacy_session(session_id, owner, fields)

    async def _in_all(self, change: Awaitable[Any]) -> None:
        """The set of every session follows what the owner's slot did. It is the approximate
        count by design, so its failure never undoes that nor fails the call: a session left
        out of it expires all the same, and one left in it is dropped at its score."""
        with contextlib.suppress(StoreUnavailable):
            await self._guard(change, LEGACY_ALL_KEY)

    async def ping(self) -> None:
        if self._cluster is None:
            await self._guard(self._client.ping())
            return
        info = await self._guard(self._cluster.cluster_info())
        state = str(info.get("cluster_state", "unknown"))
        if state != "ok":
            # Every keyed command would answer CLUSTERDOWN: the store cannot serve.
            raise self._unavailable(f"the cluster says cluster_state:{state}")

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
        if self._cluster is None:
            return {"": await self._guard(self._client.info(section))}
        cluster = self._cluster
        await self._guard(cluster.initialize())
        return {
            node.name: await self._guard(cluster.info(section, target_nodes=node))
            for node in cluster.get_primaries()
        }

    async def close(self) -> None:
        await self._clients.close()

    async def _guard(self, operation: Awaitable[T], key: str | None = None) -> T:
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
                if self._cluster is not None:
                    await self._learn_slots(self._cluster, operation)
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
            raise self._unavailable(cause) from None
        except _BROKEN_LINK as broken:
            cause = _on_node(breaker, f"the connection broke ({type(broken).__name__}: {broken})")
            breaker.trip(cause)
            raise self._unavailable(cause) from None
        breaker.close()
        return result

    def _breaker_of(self, key: str | None) -> _Breaker:
        """The backoff an operation on `key` obeys and feeds: on a cluster, that of the node
        redis-py's slot map names for the key's slot; else (no key, no cluster, no slot map
        yet) the store's own."""
        cluster = self._cluster
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
        return self._unavailable(f"{breaker.cause} (reconnecting)")

    def _unavailable(self, cause: str) -> RedisUnavailable:
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


def _fields(route: TaskRoute) -> list[Any]:
    return [
        "backend", route.backend,
        "replica", route.replica,
        "tenant", route.tenant,
        "principal", route.principal,
        "created_at_ms", route.created_at_ms,
        "ttl_ms", "" if route.ttl_ms is None else route.ttl_ms,
        "expires_at_ms", route.expires_at_ms,
    ]  # fmt: skip


def _route(task_id: str, raw: Any) -> TaskRoute | None:
    """A route from HGETALL's dict (or a script's flat list); None if the hash is not one."""
    if isinstance(raw, list):
        raw = dict(zip(raw[::2], raw[1::2], strict=True))
    fields = {_text(k): _text(v) for k, v in raw.items()}
    try:
        ttl = fields["ttl_ms"]
        return TaskRoute(
            task_id=task_id,
            backend=fields["backend"],
            replica=fields["replica"],
            tenant=fields["tenant"],
            principal=fields["principal"],
            created_at_ms=int(fields["created_at_ms"]),
            ttl_ms=int(ttl) if ttl else None,
            expires_at_ms=int(fields["expires_at_ms"]),
        )
    except (KeyError, ValueError):
        return None


def _session_keys(owner: str, session_id: str) -> list[str]:
    """The keys of the per-owner session scripts, both on the owner's slot."""
    return [legacy_session_key(owner, session_id), legacy_owner_key(owner)]


def _legacy_session(session_id: str, owner: str, raw: Any) -> LegacySession | None:
    """A session from HGETALL's dict (or a script's flat list); None if the hash is not one."""
    if isinstance(raw, list):
        raw = dict(zip(raw[::2], raw[1::2], strict=True))
    fields = {_text(k): v for k, v in raw.items()}
    record, expiry = fields.get("r"), fields.get("e")
    if record is None or expiry is None:
        return None
    try:
        expires_at_ms = int(expiry)
    except ValueError:
        return None
    upstreams: dict[str, UpstreamSession] = {}
    for name, value in fields.items():
        backend = name.removeprefix("u:")
        upstream = decode_upstream(value) if backend != name else None
        if upstream is not None:
            upstreams[backend] = upstream
    return decode_record(session_id, owner, record, expires_at_ms, upstreams)


def _version(info: Any) -> tuple[int, ...]:
    return tuple(int(part) for part in str(info["redis_version"]).split(".")[:3])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
