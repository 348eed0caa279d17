"""The wire of taskgate's own upstream listens: what one asks for, and how what the upstream
sends over it is read (its events' JSON-RPC messages, the names its acknowledgement lists, an
event's params as relayed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from gateway.protocol.meta import TASKS_EXTENSION
from gateway.upstream.calls import own_request

LISTEN = "subscriptions/listen"
UPDATED = "notifications/resources/updated"
RESOURCES = "resourceSubscriptions"
TASK_IDS = "taskIds"
_DROPPED = ("_meta", "resultType")  # the upstream's, not the task's (as pollers.py drops)


def listen_request(
    request_id: str, uris: Sequence[str], task_ids: list[str], headers: dict[str, str]
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one upstream listen naming `uris` and `task_ids` (the tasks
    extension declared when it names any), over taskgate's own headers and `headers`."""
    notifications: dict[str, Any] = {}
    capabilities: dict[str, Any] = {}
    if uris:
        notifications[RESOURCES] = list(uris)
    if task_ids:
        notifications[TASK_IDS] = task_ids
        capabilities["extensions"] = {TASKS_EXTENSION: {}}
    return own_request(request_id, LISTEN, {"notifications": notifications}, capabilities, headers)


def sse_message(data: str | None) -> dict[str, Any] | None:
    """The JSON-RPC message an SSE event carries, or None."""
    if data is None:
        return None
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return message if isinstance(message, dict) else None


def acknowledged_names(params: dict[str, Any]) -> tuple[frozenset[str], frozenset[str]]:
    """The URIs and the task ids an upstream acknowledgement's params list."""
    notifications = params.get("notifications")
    if not isinstance(notifications, dict):
        notifications = {}
    return _strings(notifications.get(RESOURCES)), _strings(notifications.get(TASK_IDS))


def less_envelope(params: dict[str, Any]) -> dict[str, Any]:
    """An upstream notification's params (or a tasks/get result) as relayed: without the
    upstream's `_meta` (the ListenStream adds the client's subscriptionId) or a `resultType`."""
    return {key: value for key, value in params.items() if key not in _DROPPED}


def _strings(value: object) -> frozenset[str]:
    if not isinstance(value, list):
        return frozenset()
    return frozenset(item for item in value if isinstance(item, str))
