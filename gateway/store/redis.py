"""Task routes in Redis: a hash per task, written by an insert-only script, expiring by itself."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from gateway.store.base import Recorded, StoreUnavailable, TaskRoute
from gateway.store.keys import route_key

T = TypeVar("T")

MIN_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0

# Insert-only: a live hash is returned untouched, so the caller can tell "already mine" from
# "somebody else's"; only an absent key is written.
_RECORD = """
local existing = redis.call('HGETALL', KEYS[1])
if #existing > 0 then return existing end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIREAT', KEYS[1], ARGV[1])
return {}
"""
# Only the expiry moves; a route that already expired is not brought back.
_REFRESH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'ttl_ms', ARGV[1], 'expires_at_ms', ARGV[2])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
return 1
"""


class RedisStore:
    """A TaskRouteStore on redis-py's asyncio client (hiredis parser when installed), pooled."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        wait_replicas: int = 0,
        wait_aof: bool = False,
        wait_timeout_ms: int = 500,
    ) -> None:
        # A durable write waits for WAIT/WAITAOF on top of its own round trip.
        self._timeout_s = timeout_s + (wait_timeout_ms / 1000 if wait_aof or wait_replicas else 0)
        self._client: aioredis.Redis = aioredis.Redis.from_url(
            url,
            socket_timeout=self._timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=30,
        )
        self._wait_replicas = wait_replicas
        self._wait_aof = wait_aof
        self._wait_timeout_ms = wait_timeout_ms
        self._backoff_s = 0.0
        self._retry_at = 0.0
        self._record = self._client.register_script(_RECORD)
        self._refresh = self._client.register_script(_REFRESH)

    async def record(self, route: TaskRoute) -> Recorded:
        key = route_key(route.task_id)
        args = [route.expires_at_ms, *_fields(route)]
        if not self._wait_aof and self._wait_replicas == 0:
            existing = await self._guard(self._record(keys=[key], args=args))
        else:
            existing = await self._guard(self._record_durably(key, args))
        if not existing:
            return Recorded.INSERTED
        found = _route(route.task_id, existing)
        return (
            Recorded.ALREADY if found is not None and found.same_owner(route) else Recorded.CONFLICT
        )

    async def _record_durably(self, key: str, args: list[Any]) -> Any:
        # WAIT/WAITAOF count the writes of their own connection: one pipeline, one connection.
        async with self._client.pipeline(transaction=False) as pipe:
            await self._record(keys=[key], args=args, client=pipe)
            if self._wait_aof:
                pipe.execute_command("WAITAOF", 1, self._wait_replicas, self._wait_timeout_ms)
            else:
                pipe.execute_command("WAIT", self._wait_replicas, self._wait_timeout_ms)
            existing, acks = await pipe.execute()
        if existing:
            return existing  # nothing was written, so there is nothing to wait for
        local, replicas = (acks[0], acks[1]) if self._wait_aof else (1, acks)
        if local < 1 or replicas < self._wait_replicas:
            raise StoreUnavailable(
                f"the task store acknowledged the route on {replicas} of "
                f"{self._wait_replicas} replicas (local fsync: {bool(local)}) in time; retry"
            )
        return existing

    async def lookup(self, task_id: str) -> TaskRoute | None:
        fields = await self._guard(self._client.hgetall(route_key(task_id)))
        return _route(task_id, fields) if fields else None

    async def refresh_expiry(self, task_id: str, ttl_ms: int | None, expires_at_ms: int) -> None:
        ttl = "" if ttl_ms is None else ttl_ms
        await self._guard(self._refresh(keys=[route_key(task_id)], args=[ttl, expires_at_ms]))

    async def ping(self) -> None:
        await self._guard(self._client.ping())

    async def server_version(self) -> tuple[int, ...]:
        info = await self._guard(self._client.info("server"))
        return tuple(int(part) for part in str(info["redis_version"]).split(".")[:3])

    async def close(self) -> None:
        await self._client.aclose()

    async def _guard(self, operation: Awaitable[T]) -> T:
        """Redis errors enter the gateway here, as StoreUnavailable (retryable).

        After a connection failure, calls fail at once for a backoff that doubles up to
        MAX_BACKOFF_S: a Redis that is down is not hammered by every request, and clients get
        their retryable answer without waiting for a connect timeout each time.
        """
        if time.monotonic() < self._retry_at:
            if inspect.iscoroutine(operation):
                operation.close()
            raise StoreUnavailable("the task store is unavailable (reconnecting); retry")
        try:
            async with asyncio.timeout(self._timeout_s * 2):
                result = await operation
        except ResponseError as exc:
            raise StoreUnavailable(f"the task store refused the request ({exc}); retry") from None
        except (TimeoutError, RedisError) as exc:
            self._backoff_s = min(max(self._backoff_s * 2, MIN_BACKOFF_S), MAX_BACKOFF_S)
            self._retry_at = time.monotonic() + self._backoff_s
            raise StoreUnavailable(
                f"the task store is unavailable ({type(exc).__name__ or 'timeout'}); retry"
            ) from None
        self._backoff_s = 0.0
        self._retry_at = 0.0
        return result


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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
