"""A replica of the 2025 era in the modern pipeline (gateway/bridge/ speaks to it): a call
sent there, what a tools/call may make a task of, and the task methods of a route that names a
2025-era session (gateway/bridge/tasks.py)."""

from __future__ import annotations

from typing import Any

from gateway.auth import Principal
from gateway.bridge.calls import forward_2025
from gateway.bridge.task_input import TaskGone
from gateway.bridge.tasks import TaskCall, cancel, snapshot, task_support, update
from gateway.errors import GatewayError, InBandError, Retryable, TaskNotFound
from gateway.h1.request import DownstreamRequest, Reply
from gateway.observe.exchange import Exchange
from gateway.pipeline.replies import result
from gateway.pipeline.state import Gateway
from gateway.protocol.codes import Code
from gateway.protocol.envelope import RPCRequest
from gateway.protocol.meta import CLIENT_CAPABILITIES_KEY, TASKS_EXTENSION
from gateway.store.base import TaskRoute
from gateway.upstream.replicas import Backend, Replica

_BAD_RESPONSES = (
    "Invalid params: tasks/update needs inputResponses, mapping each key of inputRequests to "
    "the answer's result"
)


async def call_2025(
    gateway: Gateway,
    backend: Backend,
    replica: Replica,
    message: RPCRequest,
    name: str | None,
    principal: Principal,
    extra: dict[str, str],
    request: DownstreamRequest,
) -> Reply:
    """`message` to a replica of the 2025 era, in the caller's session there (a tools/call:
    as a task when the tool and the server run it so)."""
    tasks = None
    if message.method == "tools/call":
        tasks = task_call(gateway, backend, name or "", message)
    return await forward_2025(
        gateway.callers,
        gateway.catalog.eras,
        backend,
        replica,
        message,
        name,
        principal,
        extra,
        request,
        tasks,
    )


def task_call(gateway: Gateway, backend: Backend, tool: str, message: RPCRequest) -> TaskCall:
    """What a tools/call to a 2025-era replica may become: the tool's taskSupport as the
    backend listed it, and whether the client declared the Tasks extension."""
    view = gateway.catalog.last_view(backend.name)
    listed = view.tools.get(tool) if view is not None else None
    return TaskCall(gateway.tasks, task_support(listed), _declares_tasks(message))


async def task_method_2025(
    gateway: Gateway,
    message: RPCRequest,
    route: TaskRoute,
    backend: Backend,
    principal: Principal,
    seen: Exchange,
) -> Reply:
    """tasks/get, tasks/cancel or tasks/update of a task a 2025-era server runs, in the
    session its route names, on its replica (a session lives on one)."""
    replica = backend.replica(route.replica)
    if replica is None:
        raise Retryable(
            "The replica that owns this task is not in taskgate's configuration now; retry",
            request_id=message.id,
            retry_after_s=5,
        )
    seen.replica = replica.label
    asks = gateway.tasks.task_input
    if asks is None:
        raise AssertionError("the process serves 2025-era tasks without their questions")
    headers = {**backend.credentials, **backend.identity(principal.tenant, principal.subject)}
    timeout_s = backend.task_timeout_s
    try:
        if message.method == "tasks/get":
            answer = await snapshot(asks, replica, route, headers, timeout_s)
        elif message.method == "tasks/update":
            responses = responses_of(message)
            answer = await update(asks, replica, route, headers, responses, timeout_s)
        else:
            answer = await cancel(gateway.pool, replica, route, headers, timeout_s)
    except TaskGone:
        # The server lost it (it restarted, or expired it): a task that does not exist.
        gateway.tasks.outcomes["owner_lost"] += 1
        raise TaskNotFound(message.id) from None
    except GatewayError as failed:
        failed.request_id = message.id
        raise
    return result(message, answer)


def _declares_tasks(message: RPCRequest) -> bool:
    meta: Any = message.params.get("_meta")
    declared = meta.get(CLIENT_CAPABILITIES_KEY) if isinstance(meta, dict) else None
    extensions = declared.get("extensions") if isinstance(declared, dict) else None
    return isinstance(extensions, dict) and TASKS_EXTENSION in extensions


def responses_of(message: RPCRequest) -> dict[str, Any]:
    """tasks/update's inputResponses (key -> the answer's result), or -32602 saying so."""
    responses = message.params.get("inputResponses")
    if not isinstance(responses, dict) or not all(isinstance(v, dict) for v in responses.values()):
        raise InBandError(_BAD_RESPONSES, code=Code.INVALID_PARAMS, request_id=message.id)
    return responses
