"""2025-era sessions in Redis: a hash per session, counted per owner and in all, on the
process's one RedisLink (the route store's)."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable
from typing import Any

from gateway.errors import StoreUnavailable
from gateway.store.keys import (
    LEGACY_ALL_KEY,
    legacy_owner_key,
    legacy_session_key,
    legacy_session_prefix,
)
from gateway.store.redis_link import RedisLink, as_text
from gateway.store.sessions import (
    LegacySession,
    Opening,
    OpenOutcome,
    UpstreamSession,
    decode_record,
    decode_upstream,
    encode_record,
    encode_upstream,
)

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
_SET_LEVEL = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'l', ARGV[1])
return 1
"""
_END_SESSION = """
local fields = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return fields
"""


class RedisSessionStore:
    """A SessionStore on a RedisLink it shares: it neither opens nor closes the link, whose
    owner (the route store) closes it after this store's last use."""

    def __init__(self, link: RedisLink) -> None:
        self._client = link.client
        self._guard = link.guard
        self._open_session = self._client.register_script(_OPEN_SESSION)
        self._count_sessions = self._client.register_script(_COUNT_SESSIONS)
        self._bind_upstream = self._client.register_script(_BIND_UPSTREAM)
        self._touch_session = self._client.register_script(_TOUCH_SESSION)
        self._end_session = self._client.register_script(_END_SESSION)
        self._set_level = self._client.register_script(_SET_LEVEL)

    async def open_session(
        self, session: LegacySession, *, max_per_owner: int, max_total: int
    ) -> Opening:
        count = self._count_sessions(keys=[LEGACY_ALL_KEY], args=[session.session_id])
        live = await self._guard(count, LEGACY_ALL_KEY)
        if int(live) >= max_total:
            return Opening(OpenOutcome.STORE_FULL)
        owner = session.owner
        keys = _session_keys(owner, session.session_id)
        args: list[Any] = [
            session.session_id, session.expires_at_ms, max_per_owner, encode_record(session),
            legacy_session_prefix(owner),
        ]  # fmt: skip
        reply = await self._guard(self._open_session(keys=keys, args=args), keys[0])
        ids = [as_text(session_id) for session_id in reply[::2]]
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
        return Opening(OpenOutcome.OPENED, tuple(ended for ended in evicted if ended is not None))

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

    async def set_log_level(self, session_id: str, owner: str, level: str) -> bool:
        key = legacy_session_key(owner, session_id)
        return bool(await self._guard(self._set_level(keys=[key], args=[level]), key))

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


def _session_keys(owner: str, session_id: str) -> list[str]:
    """The keys of the per-owner session scripts, both on the owner's slot."""
    return [legacy_session_key(owner, session_id), legacy_owner_key(owner)]


def _legacy_session(session_id: str, owner: str, raw: Any) -> LegacySession | None:
    """A session from HGETALL's dict (or a script's flat list); None if the hash is not one."""
    if isinstance(raw, list):
        raw = dict(zip(raw[::2], raw[1::2], strict=True))
    fields = {as_text(k): v for k, v in raw.items()}
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
    level = fields.get("l")
    log_level = as_text(level) if level is not None else ""
    return decode_record(session_id, owner, record, expires_at_ms, upstreams, log_level)
