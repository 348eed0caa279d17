"""What the limits keep: token buckets and counts of live tasks, per tenant (docs/limits.md).

A request asks once, atomically, for every bucket and count that applies to it (`take`): the
whole answer is one script on a Redis store, every instance counting in the same buckets, and
a lookup in process on SQLite. Nothing is taken unless all of them allow it. A task created is
counted afterwards (`created`), so a tenant's calls in flight when it reaches a count may pass
it by as many (their own `concurrent` bounds that).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.store.base import now_ms


@dataclass(frozen=True, slots=True)
class Bucket:
    """One token bucket of a tenant: `key` names it within the tenant ("r" its requests,
    "r:<principal>" a principal's); it holds `size` tokens and gains `per_ms` a millisecond."""

    key: str
    per_ms: float
    size: float
    cost: int  # 1: tokens are taken (a lease's); 0: one must be there, none is taken (creations)


@dataclass(frozen=True, slots=True)
class Count:
    """A tenant's set of live task ids (`key`), which must hold fewer than `limit`."""

    key: str
    limit: int


# What `take` answers: (refused, wait_ms, granted, room); see LimitStore.take.
Taken = tuple[int, int, int, tuple[int, ...]]


class LimitStore(Protocol):
    # True when every instance takes from the same buckets: the limiter then leases tokens in
    # batches, so that a busy caller does not cost a store call per request.
    shared: bool

    async def take(
        self, tenant: str, buckets: Sequence[Bucket], counts: Sequence[Count], lease: int = 1
    ) -> Taken:
        """(0, 0, granted, room) when every bucket has a token and every count is under its
        limit, and then the buckets of cost 1 give `granted` each: `lease`, or fewer if one
        holds fewer (at least 1); `room` is what each then has left, buckets first (whole
        tokens) and counts after (places). Else (1 + the index of the first refusal, buckets
        first and counts after, the milliseconds until it would pass, 0, ()), nothing taken."""
        ...

    async def created(
        self,
        tenant: str,
        buckets: Sequence[Bucket],
        counts: Sequence[Count],
        task_id: str,
        expires_at_ms: int,
    ) -> None:
        """A task was created: each bucket gives a token (it may go below zero, which later
        creations wait out) and each count holds the id until `expires_at_ms`."""
        ...


def refill(tokens: float, at_ms: float, now: float, bucket: Bucket) -> float:
    """The tokens a bucket holds at `now` that held `tokens` at `at_ms`."""
    return min(bucket.size, tokens + max(0.0, now - at_ms) * bucket.per_ms)


def wait_ms(tokens: float, bucket: Bucket) -> int:
    """How long until a bucket holding `tokens` holds one."""
    return max(1, math.ceil((1 - tokens) / bucket.per_ms))


class LocalLimits:
    """A LimitStore in process, for the SQLite store: this process's buckets and counts, at most
    `max_tracked` keys of each kind (the least recently used goes: a bucket forgotten is full
    again, a count forgotten counts from zero). A restart forgets them too (docs/limits.md)."""

    shared = False

    def __init__(self, max_tracked: int) -> None:
        self._max = max_tracked
        self._buckets: OrderedDict[tuple[str, str], list[float]] = OrderedDict()
        self._counts: OrderedDict[tuple[str, str], dict[str, int]] = OrderedDict()

    async def take(
        self, tenant: str, buckets: Sequence[Bucket], counts: Sequence[Count], lease: int = 1
    ) -> Taken:
        now = time.monotonic() * 1000
        states = [self._bucket(tenant, bucket, now) for bucket in buckets]
        granted = lease
        for index, (bucket, state) in enumerate(zip(buckets, states, strict=True)):
            if state[0] < 1:
                return index + 1, wait_ms(state[0], bucket), 0, ()
            if bucket.cost:
                granted = min(granted, math.floor(state[0]))
        wall = now_ms()
        places = []
        for index, count in enumerate(counts):
            ids = self._ids(tenant, count.key, wall)
            if len(ids) >= count.limit:
                return len(buckets) + index + 1, max(1, min(ids.values()) - wall), 0, ()
            places.append(count.limit - len(ids))
        for bucket, state in zip(buckets, states, strict=True):
            if bucket.cost:
                state[0] -= granted
        tokens = [math.floor(state[0]) for state in states]
        return 0, 0, granted, (*tokens, *places)

    async def created(
        self,
        tenant: str,
        buckets: Sequence[Bucket],
        counts: Sequence[Count],
        task_id: str,
        expires_at_ms: int,
    ) -> None:
        now = time.monotonic() * 1000
        for bucket in buckets:
            self._bucket(tenant, bucket, now)[0] -= 1
        wall = now_ms()
        for count in counts:
            self._ids(tenant, count.key, wall)[task_id] = expires_at_ms

    def _bucket(self, tenant: str, bucket: Bucket, now: float) -> list[float]:
        """The bucket's [tokens, at], refilled to `now`."""
        key = (tenant, bucket.key)
        state = self._buckets.get(key)
        if state is None:
            state = self._buckets[key] = [bucket.size, now]
            if len(self._buckets) > self._max:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            state[0] = refill(state[0], state[1], now, bucket)
            state[1] = now
        return state

    def _ids(self, tenant: str, key: str, wall: int) -> dict[str, int]:
        """The live ids of one count (the expired ones dropped)."""
        found = self._counts.get((tenant, key))
        if found is None:
            found = self._counts[(tenant, key)] = {}
            if len(self._counts) > self._max:
                self._counts.popitem(last=False)
            return found
        self._counts.move_to_end((tenant, key))
        for task_id in [task_id for task_id, until in found.items() if until <= wall]:
            del found[task_id]
        return found
