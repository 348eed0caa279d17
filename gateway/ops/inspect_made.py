"""`taskgate task inspect` and GET /tasks/<id> for a task taskgate runs itself: its owner, its
status, the instance holding its call and that holder's lease, the size of its result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.config import Config
from gateway.observe.access import task_hash
from gateway.ops.inspect import utc
from gateway.store.made import LIVE, MadeTask

_TEXT = ("tenant", "principal", "backend", "tool", "status", "holder", "status_message")
_NUMBERS = ("created_at_ms", "updated_at_ms", "ttl_ms", "poll_interval_ms", "lease_until_ms")


@dataclass(frozen=True, slots=True)
class Inspected:
    """A task taskgate runs as the operator sees it: its record, and its result's size (the
    admin listener says how large the result is, not what it says)."""

    task: MadeTask
    result_bytes: int


def describe_made(found: Inspected, config: Config, now: int, source: str) -> str:
    """What `task inspect` prints of a task taskgate runs: label, value, one per line."""
    task = found.task
    gone = "" if task.backend in config.backends else "  (not in the configuration now)"
    if task.status in LIVE:
        left = task.lease_until_ms - now
        lease = f"{utc(task.lease_until_ms)}  " + (
            f"(renewed; {left} ms left)" if left >= 0 else "(lapsed: the next read fails it)"
        )
    else:
        lease = "- (ended)"
    fields = [
        ("task", f"{task_hash(task.task_id)}  (as the request log shows it)"),
        ("kind", "run by taskgate (the route's task.mode)"),
        ("status", task.status + (f"  ({task.status_message})" if task.status_message else "")),
        ("backend", task.backend + gone),
        ("tool", task.tool),
        ("tenant", task.tenant or "- (anonymous)"),
        ("principal", task.principal or "- (anonymous)"),
        ("holder", task.holder or "-"),
        ("lease", lease),
        ("cancel", "asked" if task.cancel_requested else "-"),
        ("created", utc(task.created_at_ms)),
        ("updated", utc(task.updated_at_ms)),
        ("expires", utc(task.expires_at_ms)),
        ("result", f"{found.result_bytes} bytes" if found.result_bytes else "-"),
        ("source", source),
    ]
    return "\n".join(f"{label:<10} {value}" for label, value in fields)


def made_json(task: MadeTask) -> dict[str, Any]:
    """A task taskgate runs as the admin listener answers it (its result's size, not the
    result: the operator needs to know it is there, not what it says)."""
    shown: dict[str, Any] = {"task": task_hash(task.task_id), "kind": "made"}
    shown.update({key: getattr(task, key) for key in (*_TEXT, *_NUMBERS)})
    shown["cancel_requested"] = task.cancel_requested
    shown["result_bytes"] = len(task.outcome)
    return shown


def made_from_json(task_id: str, body: Any) -> Inspected:
    """The task `made_json` described; ValueError when the answer is not one."""
    if not isinstance(body, dict) or body.get("kind") != "made":
        raise ValueError("not a task taskgate runs")
    if not all(isinstance(body.get(key), str) for key in _TEXT):
        raise ValueError(f"{', '.join(_TEXT)} must be strings")
    numbers = [body.get(key) for key in (*_NUMBERS, "result_bytes")]
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
        raise ValueError(f"{', '.join(_NUMBERS)} and result_bytes must be integers")
    task = MadeTask(
        task_id=task_id,
        **{key: body[key] for key in (*_TEXT, *_NUMBERS)},
        cancel_requested=body.get("cancel_requested") is True,
    )
    return Inspected(task, body["result_bytes"])
