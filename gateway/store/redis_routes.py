"""Task routes in Redis: a hash per task, written by an insert-only script, expiring by itself;
durable on request (WAIT, WAITAOF) on the connection that wrote it."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from redis.asyncio.cluster import PipelineCommand, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.store.base import Recorded, TaskRoute
from gateway.store.keys import route_key
from gateway.store.redis_client import DEFAULT_MAX_CONNECTIONS, TLSFiles
from gateway.store.redis_errors import AOF_OFF, TOPOLOGY_ERRORS, aof_off, pool_exhausted
from gateway.store.redis_limits import RedisLimits
from gateway.store.redis_link import BROKEN_LINK, RedisLink, as_text
from gateway.store.redis_made import RedisMadeTaskStore
from gateway.store.redis_questions import RedisQuestionStore
from gateway.store.redis_sessions import RedisSessionStore

log = logging.getLogger("taskgate.store")

# A server that turned its AOF off refuses every WAITAOF: each creation fails (and logs so);
# the operator's line that names the fix comes at most this often, not once per request.
AOF_OFF_LOG_INTERVAL_S = 60.0

# Insert-only: a live hash is returned as it is, so the caller can tell "already mine" from
# "somebody else's"; only an absent key is written (a found one gets one field written again
# unchanged, for a durable write's WAIT to cover it: RedisRouteStore._acknowledged).
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


class RedisRouteStore:
    """A TaskRouteStore on a RedisLink of its own: one server, a Sentinel service's master, or
    a Redis Cluster, as the URL says. It owns the link (`close` closes it); the 2025-era
    session store of the process shares it (`sessions`)."""

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
        # A durable write waits for WAIT/WAITAOF on top of its own round trip.
        wait_s = wait_timeout_ms / 1000 if wait_aof or wait_replicas else 0
        self.link = RedisLink(
            url, timeout_s=timeout_s, tls=tls, wait_s=wait_s, max_connections=max_connections
        )
        self._client = self.link.client
        self._guard = self.link.guard
        self._wait_replicas = wait_replicas
        self._wait_aof = wait_aof
        self._wait_timeout_ms = wait_timeout_ms
        self._aof_off_logged_at = float("-inf")
        self._record = self._client.register_script(_RECORD)
        self._refresh = self._client.register_script(_REFRESH)
        self._lookup_owned = self._client.register_script(_LOOKUP_OWNED)
        self._sessions = RedisSessionStore(self.link)
        self._questions = RedisQuestionStore(self.link)
        self._made = RedisMadeTaskStore(self.link, self.durably)
        self._limits = RedisLimits(self.link)

    @property
    def where(self) -> str:
        """The store's URL, its password masked."""
        return self.link.where

    def made(self) -> RedisMadeTaskStore:
        """The tasks taskgate runs, on this store's link, created as durably as routes."""
        return self._made

    def limits(self, max_tracked: int) -> RedisLimits:
        """The limits' buckets and counts, on this store's link: every instance shares them
        (`max_tracked` bounds what one process keeps, and Redis keeps it all here)."""
        del max_tracked
        return self._limits

    def questions(self) -> RedisQuestionStore:
        """The 2025-era tasks' questions on this store's link (always the same store)."""
        return self._questions

    def sessions(self) -> RedisSessionStore:
        """The 2025-era session store on this store's link (always the same one)."""
        return self._sessions

    async def record(self, route: TaskRoute) -> Recorded:
        key = route_key(route.task_id)
        existing = await self.durably(self._record, key, [route.expires_at_ms, *_fields(route)])
        if not existing:
            return Recorded.INSERTED
        found = _route(route.task_id, existing)
        return (
            Recorded.ALREADY if found is not None and found.same_owner(route) else Recorded.CONFLICT
        )

    async def durably(self, script: AsyncScript, key: str, args: list[Any]) -> Any:
        """`script` run on `key` with `args`, its reply once the write is as durable as
        store.durability says (WAIT, WAITAOF): a route's record, a made task's creation."""
        if not self._wait_aof and self._wait_replicas == 0:
            return await self._guard(script(keys=[key], args=args), key)
        if self.link.cluster is not None:
            batch = self._on_slot_master(self.link.cluster, script, key, args)
            return await self._guard(batch, key)
        return await self._guard(self._durably(script, key, args), key)

    async def _durably(self, script: AsyncScript, key: str, args: list[Any]) -> Any:
        # WAIT/WAITAOF count the writes of their own connection: one pipeline, one connection
        # (to the master a Sentinel names, for redis+sentinel).
        client = self._client
        assert not isinstance(client, RedisCluster)  # a cluster's goes to the slot's master
        async with client.pipeline(transaction=False) as pipe:
            await script(keys=[key], args=args, client=pipe)
            pipe.execute_command(*self._wait_command())
            # Each reply as it is (an error too): WAITAOF's refusal in redis-py's pipeline
            # wording would hide what the server said.
            existing, acks = await pipe.execute(raise_on_error=False)
        if isinstance(existing, Exception):
            raise existing
        if isinstance(acks, Exception):
            raise self._wait_refused(acks, "")
        return self._acknowledged(existing, acks)

    async def _on_slot_master(
        self, cluster: RedisCluster, script: AsyncScript, key: str, args: list[Any]
    ) -> Any:
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
                raise self.link.unavailable("no master serves the route's slot")
            batch = [
                PipelineCommand(0, "EVALSHA", script.sha, 1, key, *args),
                PipelineCommand(1, *self._wait_command()),
            ]
            try:
                await node.execute_pipeline(batch)
            except (RedisConnectionError, RedisTimeoutError, *BROKEN_LINK) as lost:
                if pool_exhausted(lost):
                    raise  # no link was lost: the node's pool is full (see RedisLink.guard)
                failure = lost
                await self._relearn(cluster, key)
                continue
            existing, acks = batch[0].result, batch[1].result
            if isinstance(existing, NoScriptError):
                await cluster.script_load(script.script)  # on every master
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
                self.link.where, AOF_OFF, server, refused, AOF_OFF_LOG_INTERVAL_S,
            )  # fmt: skip
        return self.link.unavailable(f"{AOF_OFF} ({server} has appendonly no)")

    def _acknowledged(self, existing: Any, acks: Any) -> Any:
        # Found or written, the route is confirmed only by this WAIT: a route found may be this
        # very write's, from an attempt whose link broke (redis-py sends a batch again on a new
        # connection) or whose wait failed. The script rewrites one field of a found route as
        # it is, so that this connection's WAIT covers it: replication is in order.
        local, replicas = (acks[0], acks[1]) if self._wait_aof else (1, acks)
        if local < 1 or replicas < self._wait_replicas:
            raise self.link.unavailable(
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

    async def ping(self) -> None:
        await self.link.ping()

    async def server_version(self) -> tuple[int, ...]:
        """The Redis version; of a cluster, its oldest master's."""
        return await self.link.server_version()

    async def without_aof(self) -> list[str]:
        """The masters whose AOF is off (RedisLink.without_aof), which refuse WAITAOF."""
        return await self.link.without_aof()

    async def close(self) -> None:
        await self.link.close()


def _fields(route: TaskRoute) -> list[Any]:
    fields: list[Any] = [
        "backend", route.backend,
        "replica", route.replica,
        "tenant", route.tenant,
        "principal", route.principal,
        "created_at_ms", route.created_at_ms,
        "ttl_ms", "" if route.ttl_ms is None else route.ttl_ms,
        "expires_at_ms", route.expires_at_ms,
    ]  # fmt: skip
    if route.session:  # a 2025-era task's only: the others' hashes stay as they were
        fields += ("session", route.session)
    return fields


def _route(task_id: str, raw: Any) -> TaskRoute | None:
    """A route from HGETALL's dict (or a script's flat list); None if the hash is not one."""
    if isinstance(raw, list):
        raw = dict(zip(raw[::2], raw[1::2], strict=True))
    fields = {as_text(k): as_text(v) for k, v in raw.items()}
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
            session=fields.get("session", ""),  # absent in routes written before it existed
        )
    except (KeyError, ValueError):
        return None
