"""Tasks extension frames: find a CreateTaskResult, read ttlMs from a task snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, TypeGuard

from gateway.protocol.codes import RequestId

# Task ids are server-generated, high-entropy handles; anything else is answered as unknown.
MAX_TASK_ID_LENGTH = 256
TERMINAL = frozenset({"completed", "failed", "cancelled"})
# The ids of the tasks taskgate runs itself (gateway/tasks/made.py) begin so; here, compiled, as
# every tasks/get asks it first.
MADE_PREFIX = "taskgate."


class MalformedTask(ValueError):
    """A result says `resultType: "task"` but is not a usable CreateTaskResult."""


@dataclass(frozen=True, slots=True)
class CreatedTask:
    task_id: str
    ttl_ms: int | None  # required but nullable on the wire; null means unlimited
    status: str


def is_made(task_id: object) -> bool:
    """Whether a task id is one of taskgate's own (only those are looked for in its table)."""
    return isinstance(task_id, str) and task_id.startswith(MADE_PREFIX)


def valid_task_id(value: object) -> TypeGuard[str]:
    """Whether `value` can be a task id at all: 1 to MAX_TASK_ID_LENGTH characters of
    0x21-0x7e. By str methods, which cost less than a regex match on every tasks/* request (on
    ASCII, isprintable is exactly 0x20-0x7e, and a space is the one printable an id may not
    hold); tests/unit/test_task_ids.py holds them to the regex."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_TASK_ID_LENGTH
        and value.isascii()
        and value.isprintable()
        and " " not in value
    )


def created_task(message: Any, request_id: RequestId) -> CreatedTask | None:
    """The task a tools/call answer creates, None when it creates none, MalformedTask if broken.

    Only the response to `request_id` counts: an SSE stream also carries notifications.
    """
    if not isinstance(message, dict) or "method" in message or message.get("id") != request_id:
        return None
    result = message.get("result")
    if not isinstance(result, dict) or result.get("resultType") != "task":
        return None
    task_id = result.get("taskId")
    if not valid_task_id(task_id):
        raise MalformedTask("the CreateTaskResult has no usable taskId")
    ttl = result.get("ttlMs")
    if ttl is not None and (not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0):
        raise MalformedTask("the CreateTaskResult has an invalid ttlMs")
    status = result.get("status")
    return CreatedTask(
        task_id=task_id, ttl_ms=ttl, status=status if isinstance(status, str) else ""
    )


class Snapshot:
    """What taskgate reads from a tasks/get answer: the task's current lifetime. A plain class
    made per tasks/get, as envelope's messages are (why: there)."""

    __slots__ = ("ttl_ms",)

    def __init__(self, ttl_ms: int | None) -> None:
        self.ttl_ms: Final = ttl_ms


def task_snapshot(message: Any, request_id: RequestId) -> Snapshot | None:
    """The lifetime a tasks/get answer reports, or None when the answer reports none."""
    if not isinstance(message, dict) or message.get("id") != request_id:
        return None
    result = message.get("result")
    if not isinstance(result, dict) or "ttlMs" not in result:
        return None
    ttl = result["ttlMs"]
    if ttl is None or (isinstance(ttl, int) and not isinstance(ttl, bool) and ttl >= 0):
        return Snapshot(ttl_ms=ttl)
    return None
