"""The request log's task hash: an id that was not found is hashed afresh and never remembered,
so that the memo, which holds the ids owners poll, cannot make another owner's id cheaper to
refuse than an unknown one (THREAT_MODEL.md), nor be emptied by a flood of unknown ids."""

from __future__ import annotations

from gateway.observe import access
from gateway.observe.access import logged_task_hash, task_hash
from gateway.observe.exchange import Exchange


def exchange(task_id: str | None, backend: str = "") -> Exchange:
    made = Exchange()
    made.task_id = task_id
    made.backend = backend  # set once the route was found
    return made


def test_a_found_task_is_hashed_through_the_memo() -> None:
    digest = logged_task_hash(exchange("t-polled", "reports"))
    assert digest == task_hash("t-polled")
    assert access._hashes["t-polled"] == digest


def test_an_id_not_found_never_reads_or_grows_the_memo() -> None:
    digest = task_hash("t-owned")  # its owner's polls keep it in the memo
    access._hashes["t-owned"] = "remembered"  # what a read of the memo would show
    try:
        assert logged_task_hash(exchange("t-owned")) == digest
        kept = len(access._hashes)
        assert len({logged_task_hash(exchange(f"t-unknown-{i}")) for i in range(100)}) == 100
        assert len(access._hashes) == kept
        assert "t-unknown-0" not in access._hashes
    finally:
        access._hashes.pop("t-owned", None)


def test_a_request_without_a_task_shows_none() -> None:
    assert logged_task_hash(exchange(None)) == ""
