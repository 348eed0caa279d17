"""tasks/get kept to its pollIntervalMs, in the pipeline (the snapshots: gateway/limits/polling.py).

A tasks/get sooner than its caller's last one allows is answered here, before the route is
looked up: from the last answer (limits.polling.mode snapshot) or with 429 (refuse). Any other
task method of the caller drops the snapshot, so that what follows sees what it changed.
"""

from __future__ import annotations

from typing import Any

from gateway.auth import Principal
from gateway.h1.request import Reply
from gateway.limits.polling import Key, Snapshots
from gateway.observe.exchange import Exchange
from gateway.pipeline.replies import result
from gateway.pipeline.state import Gateway
from gateway.protocol.envelope import RPCRequest
from gateway.store.base import TaskRoute
from gateway.upstream.relay import Inspector


def key_of(task_id: str, principal: Principal) -> Key:
    return (task_id, principal.tenant, principal.subject)


def early(
    gateway: Gateway, message: RPCRequest, task_id: str, principal: Principal, seen: Exchange
) -> Reply | None:
    """The answer of a tasks/get that comes too soon; None when it goes on (a task method
    other than tasks/get drops the caller's snapshot first)."""
    snapshots = gateway.limits.snapshots
    key = key_of(task_id, principal)
    if message.method != "tasks/get":
        snapshots.forget(key)
        return None
    found = snapshots.early(key)
    if found is None:
        return None
    kept, left_ms = found
    if snapshots.config.mode == "refuse":
        raise gateway.limits.refuse(
            principal.tenant,
            "polling",
            "This task is polled sooner than its pollIntervalMs asks (limits.polling)",
            message.id,
            retry_after_ms=left_ms,
        )
    seen.backend = "taskgate"  # answered here: the request log names no replica
    return result(message, kept)


def following(
    gateway: Gateway, route: TaskRoute, message: RPCRequest, principal: Principal
) -> Inspector | None:
    """What sees a task method's answer: a tasks/get's moves the route's expiry when ttlMs
    changes, and is kept for limits.polling when it is on."""
    if message.method != "tasks/get":
        return None
    inspect = gateway.tasks.follow(route, message)
    snapshots = gateway.limits.snapshots
    if not snapshots.on:
        return inspect
    return keeping(inspect, snapshots, key_of(route.task_id, principal), route)


def keeping(
    inspect: Inspector | None, snapshots: Snapshots, key: Key, route: TaskRoute
) -> Inspector:
    """An inspector that keeps the tasks/get answer it sees, after `inspect` passed it, at
    most until the route expires."""

    async def keep(message: Any) -> None:
        if inspect is not None:
            await inspect(message)
        snapshots.keep(key, message, route.expires_at_ms)

    return keep
