"""The tasks taskgate runs itself for backends without tasks (gateway/tasks/made.py): the record
every instance reads, and the store's operations on it.

One record per task, written before its id is returned, gone when its ttl is over. The instance
that runs the call is its holder and renews a lease on it; every change of state is a
compare-and-set on the store, so that two instances never both finish a task and a task whose
holder stopped is failed by whichever instance reads it first (docs/tasks.md, "Tasks taskgate
runs"). Only what the owner check let through reaches these by id; the owner's reads compare
tenant and principal in the store, as task routes do."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

WORKING = "working"
INPUT_REQUIRED = "input_required"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
LIVE = frozenset({WORKING, INPUT_REQUIRED})

# What a task whose holder stopped says (its lease lapsed, or its drain ran out).
HOLDER_STOPPED = "the gateway instance running this task stopped"


@dataclass(slots=True)
class MadeTask:
    """A task taskgate runs: its owner, where it runs, and what became of it."""

    task_id: str
    tenant: str
    principal: str
    backend: str
    tool: str
    status: str
    created_at_ms: int
    updated_at_ms: int
    ttl_ms: int
    poll_interval_ms: int
    holder: str  # the instance that runs the call ("" once nobody does)
    lease_until_ms: int  # the holder's lease; past it the task failed (HOLDER_STOPPED)
    status_message: str = ""
    cancel_requested: bool = False
    # The final answer as JSON bytes: {"result": ...} or {"error": ...}; b"" while live.
    outcome: bytes = b""
    # The questions waiting for answers as JSON bytes ({key: request}); b"" unless input_required.
    inputs: bytes = b""
    # Answers given to those questions that the holder has not taken yet (key -> JSON bytes).
    answers: dict[str, bytes] = field(default_factory=dict)

    @property
    def expires_at_ms(self) -> int:
        return self.created_at_ms + self.ttl_ms

    def lapsed(self, now_ms: int) -> bool:
        """Live, but its holder stopped renewing: nobody will finish it."""
        return self.status in LIVE and self.lease_until_ms < now_ms


@dataclass(frozen=True, slots=True)
class Renewed:
    """What a lease renewal found of one held task."""

    held: bool  # still live and this instance's: False means stop the work
    cancel_requested: bool = False
    answers: dict[str, bytes] = field(default_factory=dict)


class Quota(Exception):
    """A creation over a limit of live tasks in the store: `which` names it."""

    def __init__(self, which: str, limit: int) -> None:
        super().__init__(which)
        self.which = which
        self.limit = limit


class MadeTaskStore(Protocol):
    """Durable, shared records of the tasks taskgate runs. Expired records are never returned."""

    async def create(self, task: MadeTask, *, per_principal: int, total: int) -> None:
        """Insert `task` (its id is new), durably; Quota when the principal already has
        `per_principal` records (live or ended, until they expire) or the store `total`."""
        ...

    async def lookup(self, task_id: str) -> MadeTask | None:
        """The record whoever owns it: for the operator (`taskgate task inspect`) only."""
        ...

    async def get_owned(self, task_id: str, tenant: str, principal: str | None) -> MadeTask | None:
        """The record if `tenant` (and `principal`, unless None) owns it, else None."""
        ...

    async def renew(self, holder: str, task_ids: list[str], lease_until_ms: int) -> list[Renewed]:
        """Move the lease of each of `holder`'s live tasks, in one round trip; what each said."""
        ...

    async def set_inputs(
        self, task_id: str, holder: str, inputs: bytes, taken: list[str], now_ms: int
    ) -> bool:
        """The holder's questions (b"": none, the task works again), the answers under `taken`
        dropped; False when the task is no longer the holder's."""
        ...

    async def answer(self, task_id: str, answers: dict[str, bytes], expires_at_ms: int) -> None:
        """Keep the answers whose keys the task asks now and has no answer for (until the task
        expires); ignore the others."""
        ...

    async def finish(
        self, task_id: str, holder: str, status: str, outcome: bytes, message: str, now_ms: int
    ) -> bool:
        """End the holder's live task; False when it is not the holder's or already ended."""
        ...

    async def request_cancel(self, task_id: str, now_ms: int) -> None:
        """Record a cancel for the holder to carry out; a task whose holder stopped is
        cancelled here and now."""
        ...

    async def lapse(self, task_id: str, now_ms: int) -> bool:
        """Fail a live task whose lease is over (HOLDER_STOPPED); False if it was not."""
        ...

    async def count(self, now_ms: int) -> int:
        """The records in the store (live or ended, until they expire): /metrics, inspect."""
        ...
