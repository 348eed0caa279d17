"""The limits' buckets and counts on every store (gateway/store/limits.py): what one `take`
allows and takes, all or nothing; what `created` counts; tenants apart. On a Redis Cluster too,
where a request's keys must share the tenant's slot for its one script to run."""

from __future__ import annotations

from gateway.store.base import now_ms
from gateway.store.limits import Bucket, Count, LimitStore
from tests.store.conftest import Store
from tests.support.mcp import poll_until

SLOW = 1 / 60_000  # one token a minute: no refill within a test


def limits_of(store: Store) -> LimitStore:
    return store.limits(1000)


async def test_a_bucket_gives_its_size_at_once_then_refuses_with_the_wait(store: Store) -> None:
    limits = limits_of(store)
    bucket = Bucket("r", SLOW, 3, 1)
    taken = [await limits.take("acme", [bucket], []) for _ in range(3)]
    assert taken == [(0, 0, 1, (2,)), (0, 0, 1, (1,)), (0, 0, 1, (0,))]  # and what is left
    refused, wait_ms, _, _ = await limits.take("acme", [bucket], [])
    assert refused == 1
    assert 50_000 < wait_ms <= 60_000  # a whole token a minute away


async def test_nothing_is_taken_unless_everything_allows_it(store: Store) -> None:
    limits = limits_of(store)
    tenant, principal = Bucket("r", SLOW, 2, 1), Bucket("r:ann", SLOW, 1, 1)
    assert await limits.take("acme", [tenant, principal], []) == (0, 0, 1, (1, 0))
    refused, _, _, _ = await limits.take("acme", [tenant, principal], [])
    assert refused == 2  # the principal's bucket, the second asked
    # The tenant's bucket kept the token the refused request did not take.
    assert await limits.take("acme", [tenant], []) == (0, 0, 1, (0,))
    assert (await limits.take("acme", [tenant], []))[0] == 1


async def test_tenants_and_principals_count_apart(store: Store) -> None:
    limits = limits_of(store)
    bucket = Bucket("r", SLOW, 1, 1)
    assert await limits.take("acme", [bucket], []) == (0, 0, 1, (0,))
    assert (await limits.take("acme", [bucket], []))[0] == 1
    assert await limits.take("globex", [bucket], []) == (0, 0, 1, (0,))
    # A tenant whose name spells another's key with a principal is a tenant of its own.
    assert await limits.take("acme:r", [bucket], []) == (0, 0, 1, (0,))
    assert await limits.take("acme", [Bucket("r:ann", SLOW, 1, 1)], []) == (0, 0, 1, (0,))


async def test_a_bucket_refills_at_its_rate(store: Store) -> None:
    limits = limits_of(store)
    bucket = Bucket("r", 1 / 200, 1, 1)  # five a second
    assert await limits.take("acme", [bucket], []) == (0, 0, 1, (0,))
    refused, wait_ms, _, _ = await limits.take("acme", [bucket], [])
    assert refused == 1
    assert 0 < wait_ms <= 200

    async def again() -> tuple[int, int, int]:
        return (await limits.take("acme", [bucket], []))[:3]

    await poll_until(again, lambda taken: taken == (0, 0, 1), within=5)  # or TimeoutError


async def test_a_creation_bucket_is_asked_before_and_taken_by_the_creation(store: Store) -> None:
    limits = limits_of(store)
    creations = Bucket("c", SLOW, 2, 0)  # cost 0: a token must be there, none is taken
    for _ in range(5):  # the room it reports is the tokens there: none was taken
        assert await limits.take("acme", [creations], []) == (0, 0, 1, (2,))
    far = now_ms() + 60_000
    await limits.created("acme", [creations], [], "t1", far)
    assert await limits.take("acme", [creations], []) == (0, 0, 1, (1,))
    await limits.created("acme", [creations], [], "t2", far)
    refused, wait_ms, _, _ = await limits.take("acme", [creations], [])
    assert refused == 1
    assert wait_ms > 20_000


async def test_a_count_holds_live_ids_until_they_expire(store: Store) -> None:
    limits = limits_of(store)
    rate = Bucket("r", SLOW, 100, 1)
    live = Count("t", 2)
    now = now_ms()
    await limits.created("acme", [], [live], "gone", now - 1)  # expired already: not counted
    await limits.created("acme", [], [live], "t1", now + 60_000)
    assert await limits.take("acme", [rate], [live]) == (0, 0, 1, (99, 1))  # one place left
    await limits.created("acme", [], [live], "t2", now + 30_000)
    await limits.created("acme", [], [live], "t2", now + 30_000)  # the same id once
    refused, wait_ms, _, _ = await limits.take("acme", [rate], [live])
    assert refused == 2  # the count, after the one bucket
    assert 20_000 < wait_ms <= 30_000  # until the first of them expires
    # Another principal's count, and another tenant's, are their own.
    assert await limits.take("acme", [], [Count("t:bob", 2)]) == (0, 0, 1, (2,))
    assert await limits.take("globex", [], [live]) == (0, 0, 1, (2,))


async def test_a_lease_takes_what_the_buckets_hold_up_to_its_size(store: Store) -> None:
    limits = limits_of(store)
    tenant, principal = Bucket("r", SLOW, 10, 1), Bucket("r:ann", SLOW, 4, 1)
    assert await limits.take("acme", [tenant, principal], [], 3) == (0, 0, 3, (7, 1))
    assert await limits.take("acme", [tenant, principal], [], 3) == (0, 0, 1, (6, 0))  # ann's last
    assert (await limits.take("acme", [tenant, principal], [], 3))[0] == 2
    assert await limits.take("acme", [tenant], [], 100) == (0, 0, 6, (0,))  # what the tenant kept
