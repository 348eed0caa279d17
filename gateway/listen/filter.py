"""The listen request's `notifications` filter, validated before any stream starts.

The core (basic/patterns/subscriptions) names five opt-ins; the Tasks extension adds `taskIds`
and requires the extension declared in `_meta` for it (-32021, 400, before the stream). A
filter that is not the shape the schema gives is -32602: taskgate does not guess what a client
meant to watch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.errors import InBandError
from gateway.protocol.codes import Code
from gateway.protocol.envelope import RPCRequest
from gateway.protocol.meta import TASKS_EXTENSION, Meta, require_extension

# filter flag -> the list_changed notification it opts into
LIST_FLAGS = {
    "toolsListChanged": "notifications/tools/list_changed",
    "promptsListChanged": "notifications/prompts/list_changed",
    "resourcesListChanged": "notifications/resources/list_changed",
}
RESOURCES = "resourceSubscriptions"
TASK_IDS = "taskIds"


@dataclass(frozen=True, slots=True)
class ListenFilter:
    flags: frozenset[str]  # the LIST_FLAGS keys set to true
    resource_uris: tuple[str, ...]  # in the client's order, each once
    task_ids: tuple[str, ...]


def parse_filter(
    message: RPCRequest, meta: Meta, *, max_task_ids: int, max_resource_uris: int
) -> ListenFilter:
    """The filter of a subscriptions/listen request, or the error that refuses it."""
    notifications = message.params.get("notifications")
    if not isinstance(notifications, dict):
        raise _invalid(message, "params.notifications must be an object")
    flags: set[str] = set()
    for flag in LIST_FLAGS:
        value = notifications.get(flag, False)
        if not isinstance(value, bool):
            raise _invalid(message, f"params.notifications.{flag} must be a boolean")
        if value:
            flags.add(flag)
    uris = _strings(message, notifications, RESOURCES, max_resource_uris)
    task_ids = _strings(message, notifications, TASK_IDS, max_task_ids)
    if TASK_IDS in notifications:
        # Asking for task notifications is using the extension, even with an empty list.
        require_extension(meta, message, TASKS_EXTENSION)
    return ListenFilter(frozenset(flags), uris, task_ids)


def _strings(
    message: RPCRequest, notifications: dict[str, Any], key: str, most: int
) -> tuple[str, ...]:
    value = notifications.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _invalid(message, f"params.notifications.{key} must be an array of strings")
    unique = tuple(dict.fromkeys(value))
    if len(unique) > most:
        setting = "max_task_ids" if key == TASK_IDS else "max_resource_uris"
        raise _invalid(
            message,
            f"params.notifications.{key} names {len(unique)} items; taskgate watches at most "
            f"{most} per listen (subscriptions.{setting})",
        )
    return unique


def _invalid(message: RPCRequest, why: str) -> InBandError:
    return InBandError(f"Invalid params: {why}", request_id=message.id, code=Code.INVALID_PARAMS)
