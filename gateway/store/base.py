"""The TaskRouteStore protocol, the route record, and the outcome of an insert-only write."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Protocol


def now_ms() -> int:
    """Wall-clock milliseconds: expiries are compared across processes and with Redis."""
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class TaskRoute:
    """Recorded before the client sees the task id; owner and replica never change."""

    task_id: str
    backend: str
    replica: str  # the owning replica's URL, as configured
    tenant: str
    principal: str
    created_at_ms: int  # when taskgate saw the task created (its own clock)
    ttl_ms: int | None  # the task's lifetime as last reported; None means unlimited
    expires_at_ms: int  # after this the route is gone (createdAt + ttlMs + grace, or the cap)
    # A task of a 2025-era server: the session it lives in, as "<revision> <Mcp-Session-Id>"
    # (its tasks/* go there, from any instance: gateway/bridge/tasks.py); "" for the others.
    session: str = ""

    def same_owner(self, other: TaskRoute) -> bool:
        return (self.backend, self.replica, self.tenant, self.principal) == (
            other.backend,
            other.replica,
            other.tenant,
            other.principal,
        )


class Recorded(enum.Enum):
    INSERTED = "inserted"
    ALREADY = "already"  # the same owner recorded it before (a retried write): fine
    CONFLICT = "conflict"  # somebody else owns this id: the create must fail closed


class TaskRouteStore(Protocol):
    """Durable, shared task routes. Expired routes are never returned."""

    async def record(self, route: TaskRoute) -> Recorded:
        """Insert `route` unless its id is taken; never overwrite a live route."""
        ...

    async def lookup(self, task_id: str) -> TaskRoute | None:
        """The live route of `task_id`, or None."""
        ...

    async def lookup_owned(
        self, task_id: str, tenant: str, principal: str | None
    ) -> TaskRoute | None:
        """The live route of `task_id` if `tenant` owns it (and `principal`, unless None), else
        None. The store itself leaves another owner's route out, so that such an id costs the
        same read and the same empty reply as an id never recorded (THREAT_MODEL.md)."""
        ...

    async def refresh_expiry(self, task_id: str, ttl_ms: int | None, expires_at_ms: int) -> None:
        """Move a live route's expiry (its owner and replica stay as they are)."""
        ...

    async def ping(self) -> None:
        """Raise StoreUnavailable unless the store answers."""
        ...

    async def close(self) -> None: ...
