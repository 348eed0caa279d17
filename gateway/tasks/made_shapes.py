"""A task taskgate runs, as the Tasks extension shows it: the CreateTaskResult of its tools/call
and the DetailedTask of tasks/get (and of notifications/tasks), from its record."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from gateway.store.made import COMPLETED, FAILED, INPUT_REQUIRED, MadeTask


def iso(ms: int) -> str:
    """Milliseconds since the epoch as ISO 8601 in UTC (createdAt, lastUpdatedAt)."""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _task(task: MadeTask) -> dict[str, Any]:
    shown: dict[str, Any] = {
        "taskId": task.task_id,
        "status": task.status,
        "createdAt": iso(task.created_at_ms),
        "lastUpdatedAt": iso(task.updated_at_ms),
        "ttlMs": task.ttl_ms,
        "pollIntervalMs": task.poll_interval_ms,
    }
    if task.status_message:
        shown["statusMessage"] = task.status_message
    return shown


def created(task: MadeTask) -> dict[str, Any]:
    """The tools/call answer that hands out the task (no `task` wrapper, EXT)."""
    return {"resultType": "task", **_task(task)}


def detailed(task: MadeTask) -> dict[str, Any]:
    """tasks/get's answer: the task and the field of its status (the result, the error, or
    every question still open)."""
    shown = {"resultType": "complete", **_task(task)}
    if task.status == INPUT_REQUIRED and task.inputs:
        shown["inputRequests"] = orjson.loads(task.inputs)
    elif task.status in (COMPLETED, FAILED) and task.outcome:
        outcome = orjson.loads(task.outcome)
        if task.status == COMPLETED:
            shown["result"] = outcome.get("result")
        else:
            shown["error"] = outcome.get("error")
    return shown
