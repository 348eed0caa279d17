"""2025-11-25 tasks for 2025-era clients, run by 2025-era servers that serve them, through the
front door: as the client would have them direct.

A `tools/call` with `params.task` to such a server keeps its `params.task`, and the task it
answers with is recorded, before the client sees it, as a route naming the upstream session it
lives in (the server keeps a task to its session), the client's owner check as every task's.
The client's `tasks/get`, `tasks/result` (blocking until the task ends, the server's questions
on its stream under namespaced ids, as on a call's) and `tasks/cancel` go, by that route, to
that upstream session, which must be one of the client's session's: a task is one session's,
as direct. `tasks/list` is the server's list in the client's session: relayed as it is when one
backend of the session runs tasks, the first pages merged when several do (no cursor then).
Backends of the 2026-07-28 era never see these (their tasks are the extension's).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from gateway.auth import Principal
from gateway.bridge.own_session import Opened
from gateway.bridge.shapes import runs_tool_tasks
from gateway.bridge.tasks import nested_task, route_of, session_of
from gateway.errors import InBandError, TaskNotFound
from gateway.h1.request import DownstreamRequest, Reply
from gateway.legacy import wire
from gateway.legacy.upstreams import own_headers, session_headers
from gateway.observe.exchange import Exchange
from gateway.pipeline.replies import result
from gateway.pipeline.state import Gateway
from gateway.protocol.codes import Code
from gateway.protocol.envelope import RPCRequest
from gateway.store.sessions import LegacySession, UpstreamSession
from gateway.upstream.calls import UpstreamCallError, request_result
from gateway.upstream.relay import JSON, Inspector, forward, header_lines, upstream_headers
from gateway.upstream.replicas import Backend, Replica

LEGACY_TASK_METHODS = frozenset({"tasks/get", "tasks/result", "tasks/cancel", "tasks/list"})
_ACCEPT = "application/json, text/event-stream"


def runs_tasks(gateway: Gateway, backend: Backend) -> bool:
    """Whether `backend` is a 2025-era server that said at initialize it runs tools/call as
    tasks (its replicas are one server: the first that answered says it)."""
    return runs_tool_tasks(gateway.catalog.eras.capabilities(backend))


def offers_tasks(gateway: Gateway) -> bool:
    """Whether a backend a route names tools on runs 2025-11-25 tasks."""
    routed = {route.backend for route in gateway.routes.routes if route.tools}
    return any(runs_tasks(gateway, gateway.backends[n]) for n in routed if n in gateway.backends)


def as_task(
    gateway: Gateway,
    backend: Backend,
    replica: Replica,
    upstream: UpstreamSession,
    session: LegacySession,
    principal: Principal,
    message: RPCRequest,
    extra: dict[str, str],
    batched: bool,
) -> tuple[RPCRequest, Inspector | None]:
    """A relayed request as it goes upstream, and what captures the task it makes: a tools/call
    with `params.task` to a server that runs tasks keeps it (its task's route recorded first;
    a batch member's answer cannot be inspected, so it is served plain); elsewhere the call
    goes plain, as the revision says a server without tasks serves one."""
    if message.method != "tools/call" or "task" not in message.params:
        return message, None
    if batched or not runs_tasks(gateway, backend):
        plain = RPCRequest(message.id, message.method, message.params, wire.without_task(message))
        return plain, None
    return message, capture(gateway, replica, upstream, session, principal, message, extra)


def capture(
    gateway: Gateway,
    replica: Replica,
    upstream: UpstreamSession,
    session: LegacySession,
    principal: Principal,
    message: RPCRequest,
    extra: dict[str, str],
) -> Inspector:
    """An inspector that records the route of the task a call's answer creates, with the
    upstream session it lives in, before the answer is relayed."""
    opened = Opened(upstream.session_id, session.protocol_version, {})
    recorder = gateway.tasks

    async def inspect(answer: Any) -> None:
        task = nested_task(answer, message.id)
        if task is None:
            return
        route = route_of(
            recorder, task, replica, principal.tenant, principal.subject, opened, message.id
        )
        await recorder.record(route, replica, message.id, extra)

    return inspect


async def task_method(
    gateway: Gateway,
    request: DownstreamRequest,
    message: RPCRequest,
    session: LegacySession,
    principal: Principal,
    seen: Exchange,
) -> Reply:
    """tasks/get, tasks/result, tasks/cancel by the task's route, on its upstream session;
    tasks/list in the client's session."""
    if message.method == "tasks/list":
        return await _listed(gateway, message, session, principal)
    route = await gateway.tasks.resolve(message.params.get("taskId"), principal, message.id)
    backend = gateway.backends.get(route.backend)
    upstream = next(
        (
            u
            for name, u in session.upstreams.items()
            if name == route.backend and route.session == _of(session, u)
        ),
        None,
    )
    replica = None if backend is None else backend.replica(route.replica)
    if upstream is None or backend is None or replica is None:
        raise TaskNotFound(message.id)  # another session's task, or one not served here now
    seen.backend = backend.name
    seen.replica = replica.label
    extra = _extra(backend, principal, upstream, session)
    headers = upstream_headers(request.raw_headers, name=None, extra=extra)
    # tasks/result blocks until the task ends: the call's deadline, not a task method's.
    timeout_s = backend.timeout_s if message.method == "tasks/result" else backend.task_timeout_s
    rewrite = wire.relay_rewriter(backend.name, seen)
    return await forward(
        gateway.pool, replica, message, headers, timeout_s, request, rewrite=rewrite
    )


async def _listed(
    gateway: Gateway, message: RPCRequest, session: LegacySession, principal: Principal
) -> Reply:
    """tasks/list of the backends of the session that run tasks."""
    running = [
        (gateway.backends[name], upstream)
        for name, upstream in session.upstreams.items()
        if name in gateway.backends and runs_tasks(gateway, gateway.backends[name])
    ]
    cursor = message.params.get("cursor")
    if len(running) > 1 and cursor is not None:
        raise InBandError(
            "Invalid params: this session's tasks come from several backends, listed in one "
            "page without a cursor",
            request_id=message.id,
            code=Code.INVALID_PARAMS,
        )
    pages = await asyncio.gather(
        *(_list_one(gateway, b, u, session, principal, message) for b, u in running)
    )
    if len(pages) == 1:
        return result(message, pages[0])
    return result(message, {"tasks": [task for page in pages for task in page.get("tasks", [])]})


async def _list_one(
    gateway: Gateway,
    backend: Backend,
    upstream: UpstreamSession,
    session: LegacySession,
    principal: Principal,
    message: RPCRequest,
) -> dict[str, Any]:
    replica = backend.replica(upstream.replica)
    if replica is None:
        return {"tasks": []}
    extra = _extra(backend, principal, upstream, session)
    sent = header_lines({**extra, "Content-Type": JSON, "Accept": _ACCEPT})
    own_id = f"taskgate-list-{message.id}"
    body = orjson.dumps(
        {"jsonrpc": "2.0", "id": own_id, "method": "tasks/list", "params": message.params}
    )
    try:
        listed, _ = await request_result(
            gateway.pool, replica, "tasks/list", own_id, body, sent, backend.task_timeout_s
        )
    except UpstreamCallError:
        return {"tasks": []}  # a backend that cannot list now lists nothing
    return listed


def _extra(
    backend: Backend, principal: Principal, upstream: UpstreamSession, session: LegacySession
) -> dict[str, str]:
    """taskgate's headers on a request of the upstream session."""
    return {
        **own_headers(backend, principal),
        **session_headers(upstream, session.protocol_version),
    }


def _of(session: LegacySession, upstream: UpstreamSession) -> str:
    """How a route names the upstream session (gateway/bridge/tasks.session_of)."""
    return session_of(Opened(upstream.session_id, session.protocol_version, {}))
