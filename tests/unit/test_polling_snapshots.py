"""The last tasks/get answers limits.polling keeps (gateway/limits/polling.py): for tolerance x
pollIntervalMs, never past the route's expiry, at most max_snapshots, dropped on demand."""

from __future__ import annotations

import time

from gateway.config.limits import PollingConfig
from gateway.limits.polling import Snapshots
from tests.support.mcp import poll_until

ANSWER = {"result": {"taskId": "t1", "status": "working", "pollIntervalMs": 60_000}}
FAR = 10**15  # a route that does not expire within the test


def snapshots(**config: object) -> Snapshots:
    return Snapshots(PollingConfig.model_validate({"mode": "snapshot", **config}))


def test_an_answer_is_kept_for_tolerance_x_its_interval() -> None:
    kept = snapshots(tolerance=0.5)
    kept.keep(("t1", "acme", "ann"), ANSWER, FAR)
    found = kept.early(("t1", "acme", "ann"))
    assert found is not None
    result, left_ms = found
    assert result == ANSWER["result"]
    assert 29_000 < left_ms <= 30_000
    assert kept.early(("t1", "acme", "bob")) is None  # another caller's is not this one's


async def test_a_snapshot_ends_with_its_route_whatever_the_interval() -> None:
    kept = snapshots(tolerance=1)
    kept.keep(("t1", "acme", "ann"), ANSWER, int(time.time() * 1000) + 100)
    assert kept.early(("t1", "acme", "ann")) is not None

    async def early() -> object:
        return kept.early(("t1", "acme", "ann"))

    await poll_until(early, lambda found: found is None, within=5)  # or TimeoutError


def test_an_answer_without_an_interval_or_an_error_drops_the_snapshot() -> None:
    kept = snapshots()
    kept.keep(("t1", "acme", "ann"), ANSWER, FAR)
    kept.keep(("t1", "acme", "ann"), {"error": {"code": -32602}}, FAR)
    assert kept.early(("t1", "acme", "ann")) is None


def test_at_most_max_snapshots_are_kept_and_forget_drops_one() -> None:
    kept = snapshots(max_snapshots=2)
    for task in ("t1", "t2", "t3"):
        kept.keep((task, "acme", "ann"), ANSWER, FAR)
    assert len(kept) == 2
    assert kept.early(("t1", "acme", "ann")) is None  # the oldest went
    kept.forget(("t3", "acme", "ann"))
    assert kept.early(("t3", "acme", "ann")) is None
    assert kept.early(("t2", "acme", "ann")) is not None
