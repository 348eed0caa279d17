"""The limits' buckets and counts in Redis, shared by every instance: one script a request.

Every key of one tenant carries the tenant as its hash tag, so a request's buckets and counts
are in one slot and one script checks and takes them all, atomically, by the server's clock
(TIME: the instances' clocks need not agree). A bucket is a hash {t: tokens, a: at in ms} that
expires once it would be full again; a count is a sorted set of task ids scored by expiry, which
lives as long as its longest-lived id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.store.keys import limit_key
from gateway.store.limits import Bucket, Count, Taken
from gateway.store.redis_link import RedisLink

# ARGV: the number of buckets, the lease, then per bucket its per_ms, size and cost, then per
# count its limit. KEYS: the buckets, then the counts. Returns {0, 0, granted, room...} (each
# bucket's whole tokens left, then each count's places left) or {1 + refusal, wait_ms, 0}.
# What both scripts begin with: the server's clock, and a bucket's tokens now.
_BUCKETS = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local nb = tonumber(ARGV[1])
local function tokens_of(key, per, size)
  local state = redis.call('HMGET', key, 't', 'a')
  if not state[1] then return size end
  return math.min(size, tonumber(state[1]) + math.max(0, now - tonumber(state[2])) * per)
end
local function keep(key, per, size, t)
  redis.call('HSET', key, 't', t, 'a', now)
  redis.call('PEXPIRE', key, math.ceil((size - t) / per) + 1000)
end
"""
_TAKE = (
    _BUCKETS
    + """
local granted = tonumber(ARGV[2])
local tokens = {}
for i = 1, nb do
  local per, size = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  local t = tokens_of(KEYS[i], per, size)
  if t < 1 then return {i, math.max(1, math.ceil((1 - t) / per)), 0} end
  tokens[i] = t
  if tonumber(ARGV[3 * i + 2]) > 0 then granted = math.min(granted, math.floor(t)) end
end
local answer = {0, 0, granted}
for j = nb + 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[j], '-inf', now)
  local limit = tonumber(ARGV[2 * nb + j + 2])
  local held = redis.call('ZCARD', KEYS[j])
  if held >= limit then
    local first = redis.call('ZRANGE', KEYS[j], 0, 0, 'WITHSCORES')
    return {j, math.max(1, tonumber(first[2]) - now), 0}
  end
  answer[3 + j] = limit - held
end
for i = 1, nb do
  local per, size = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  local left = tokens[i]
  if tonumber(ARGV[3 * i + 2]) > 0 then
    left = left - granted
    keep(KEYS[i], per, size, left)
  end
  answer[3 + i] = math.floor(left)
end
return answer
"""
)
# ARGV: the number of buckets, per bucket its per_ms and size, then the id and its expiry.
_CREATED = (
    _BUCKETS
    + """
for i = 1, nb do
  local per, size = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  keep(KEYS[i], per, size, tokens_of(KEYS[i], per, size) - 1)
end
local id, expires = ARGV[2 * nb + 2], tonumber(ARGV[2 * nb + 3])
for j = nb + 1, #KEYS do
  redis.call('ZADD', KEYS[j], expires, id)
  local until_ms = redis.call('PEXPIRETIME', KEYS[j])
  if until_ms < expires then redis.call('PEXPIREAT', KEYS[j], expires) end
end
return 1
"""
)


class RedisLimits:
    """A LimitStore on the route store's RedisLink (which closes it)."""

    shared = True

    def __init__(self, link: RedisLink) -> None:
        self._guard = link.guard
        self._take = link.client.register_script(_TAKE)
        self._created = link.client.register_script(_CREATED)

    async def take(
        self, tenant: str, buckets: Sequence[Bucket], counts: Sequence[Count], lease: int = 1
    ) -> Taken:
        keys = [limit_key(tenant, b.key) for b in buckets] + [
            limit_key(tenant, c.key) for c in counts
        ]
        args: list[Any] = [len(buckets), lease]
        for bucket in buckets:
            args += [repr(bucket.per_ms), repr(bucket.size), bucket.cost]
        args += [count.limit for count in counts]
        answer = await self._guard(self._take(keys=keys, args=args), keys[0])
        return int(answer[0]), int(answer[1]), int(answer[2]), tuple(int(n) for n in answer[3:])

    async def created(
        self,
        tenant: str,
        buckets: Sequence[Bucket],
        counts: Sequence[Count],
        task_id: str,
        expires_at_ms: int,
    ) -> None:
        keys = [limit_key(tenant, b.key) for b in buckets] + [
            limit_key(tenant, c.key) for c in counts
        ]
        args: list[Any] = [len(buckets)]
        for bucket in buckets:
            args += [repr(bucket.per_ms), repr(bucket.size)]
        args += [task_id, expires_at_ms]
        await self._guard(self._created(keys=keys, args=args), keys[0])
