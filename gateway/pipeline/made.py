"""The tasks taskgate runs itself in the modern pipeline: a tools/call that its route runs as a
task (gateway/tasks/made.py), and the task methods of such a task, answered from the store."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.auth import Principal
from gateway.bridge.shapes import runs_tool_tasks
from gateway.catalog.capabilities import declares_tasks
from gateway.catalog.table import Route
from gateway.h1.request import DownstreamRequest, DownstreamResponse, Reply
from gateway.observe.exchange import Exchange
from gateway.pipeline.bridged import responses_of
from gateway.pipeline.replies import result
from gateway.pipeline.state import Gateway
from gateway.protocol.codes import Code
from gateway.protocol.envelope import RPCRequest
from gateway.protocol.meta import TASKS_EXTENSION, read_meta
from gateway.tasks.made_calls import MadeCall, ModernCall
from gateway.tasks.made_session import SessionCall
from gateway.upstream.relay import JSON, upstream_headers
from gateway.upstream.replicas import Backend, Replica


def runs_as_task(gateway: Gateway, route: Route, backend: Backend, message: RPCRequest) -> bool:
    """Whether this tools/call is one taskgate runs as a task: its route says so, the client
    declares the extension (the server MUST NOT give a task to one that does not), and the
    backend does not run tasks itself (then its own are routed, as ever)."""
    if route.task is None or not read_meta(message).has_extension(TASKS_EXTENSION):
        return False
    view = gateway.catalog.last_view(backend.name)
    if view is not None and declares_tasks(view):
        return False
    return not runs_tool_tasks(gateway.catalog.eras.capabilities(backend))


async def call_as_task(
    request: DownstreamRequest,
    gateway: Gateway,
    message: RPCRequest,
    tool: str,
    principal: Principal,
    route: Route,
    backend: Backend,
    replicas: list[Replica],
    seen: Exchange,
) -> Reply:
    """The tools/call run as a task taskgate holds, on the first of `replicas` that can be
    reached (the healthy ones, in turn): the CreateTaskResult, or (mode offer) the call's own
    answer when it came within after_ms."""
    settings = route.task
    assert settings is not None  # runs_as_task said so
    replica = replicas[0]
    seen.replica = replica.label
    eras = gateway.catalog.eras
    bridged = eras.speaks_2025(backend, replica)
    if not bridged and eras.unknown(backend, replica):
        bridged = await eras.learn(backend, replica)
    extra = {**backend.credentials, **backend.identity(principal.tenant, principal.subject)}
    call: MadeCall
    if bridged:
        declared = read_meta(message).client_capabilities
        call = SessionCall(
            gateway.callers, eras, backend, replicas, message.params, principal, extra, declared,
            timeout_s=settings.ttl_s, max_result_bytes=settings.max_result_bytes,
        )  # fmt: skip
    else:
        headers = upstream_headers(request.raw_headers, name=tool, extra=extra)
        call = ModernCall(
            gateway.pool, replicas, message.params, headers, timeout_s=settings.ttl_s,
            max_result_bytes=settings.max_result_bytes, idempotent=settings.idempotent,
        )  # fmt: skip
    told = await gateway.made.run(settings, backend.name, tool, principal, call, message.id)
    if told.answer is not None:
        return result(message, told.answer)
    # The backend's own error, answered as it sent it (as the relay would have)
    error = told.error or {"code": Code.INTERNAL_ERROR, "message": "the call gave no answer"}
    body = orjson.dumps({"jsonrpc": "2.0", "id": message.id, "error": error})
    return DownstreamResponse(body=body, content_type=JSON)


async def made_task_method(
    gateway: Gateway, message: RPCRequest, principal: Principal, seen: Exchange
) -> Reply:
    """tasks/get, tasks/update or tasks/cancel of a task taskgate runs: from the store, on
    any instance."""
    made = gateway.made
    task_id = message.params.get("taskId")
    method = message.method
    answer: Any
    if method == "tasks/get":
        answer = await made.get(task_id, principal, message.id)
    elif method == "tasks/update":
        answer = await made.update(task_id, principal, responses_of(message), message.id)
    else:
        answer = await made.cancel(task_id, principal, message.id)
    seen.backend = "taskgate"
    return result(message, answer)
