"""Every Redis key taskgate writes, in one place."""

from __future__ import annotations

PREFIX = "taskgate"


def route_key(task_id: str) -> str:
    """The hash of one task route. The braces are a Redis Cluster hash tag: everything taskgate
    ever keeps about one task lands in one slot, so per-task scripts stay single-slot."""
    return f"{PREFIX}:route:{{{task_id}}}"
