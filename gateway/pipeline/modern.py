"""The 2026-07-28 pipeline: steps 5-10 of a request that the admission let in (parse, classify,
route, forward, capture, relay), in the one module that orders them and reads as the pipeline.

The numbered comments are the steps of docs/architecture.md, "The path of a request"; steps 1-4
are gateway/pipeline/admission.py's, for both eras.
"""

from __future__ import annotations

import logging
from typing import Literal

from gateway.auth import Principal
from gateway.bridge.asking import resume, resumes
from gateway.bridge.waiting import PREFIX as WAITING_PREFIX
from gateway.catalog.table import Route
from gateway.errors import (
    BadCursor,
    Retryable,
)
from gateway.h1.request import DownstreamRequest, DownstreamResponse, Reply
from gateway.listen.hub import Opened
from gateway.observe.exchange import Exchange
from gateway.pipeline import polling
from gateway.pipeline.bridged import call_2025, task_method_2025
from gateway.pipeline.made import call_as_task, made_task_method, runs_as_task
from gateway.pipeline.replies import result
from gateway.pipeline.state import Gateway
from gateway.pipeline.visible import (
    check_scopes,
    completion_route,
    normalised_not_found,
    normalised_unknown_prompt,
    owner_forgot,
    prompt_route,
    required_name,
    tool_route,
    uri_route,
)
from gateway.protocol import envelope
from gateway.protocol.codes import MetaError, MethodError
from gateway.protocol.envelope import RPCNotification, RPCRequest
from gateway.protocol.era import SESSION_HEADER, LegacyAfterAll
from gateway.protocol.headers import RoutingHeaders, check_headers
from gateway.protocol.meta import (
    PROTOCOL_VERSION_KEY,
    TASKS_EXTENSION,
    Meta,
    read_meta,
    require_extension,
)
from gateway.protocol.methods import MethodClass, classify
from gateway.protocol.tasks import MAX_TASK_ID_LENGTH, is_made
from gateway.upstream.attempt import Attempt, first_reachable
from gateway.upstream.health import task_replicas
from gateway.upstream.relay import forward, upstream_headers
from gateway.upstream.replicas import Replica

log = logging.getLogger("taskgate.handler")


# Methods served only when discover advertises their capability.
_GATED: dict[MethodClass, Literal["prompts", "resources", "completions"]] = {
    MethodClass.LIST_PROMPTS: "prompts",
    MethodClass.GET_PROMPT: "prompts",
    MethodClass.LIST_RESOURCES: "resources",
    MethodClass.LIST_TEMPLATES: "resources",
    MethodClass.READ_RESOURCE: "resources",
    MethodClass.COMPLETE: "completions",
}


async def serve(
    request: DownstreamRequest,
    body: bytes,
    gateway: Gateway,
    principal: Principal,
    slot: int,
    seen: Exchange,
) -> Reply | Opened:
    """Steps 5-10 of a 2026-07-28 request that the admission (gateway/pipeline/admission.py)
    let in and holds a slot for."""
    # 5 parse: envelope, then _meta, then the version header against the body, then the
    # version, then the other headers against the body (check_headers; docs/decisions.md, 1)
    message = envelope.parse(body, max_depth=gateway.config.listen.max_json_depth)
    if isinstance(message, RPCNotification):
        seen.method = "notification"
        return _accepted(message)
    seen.request_id = message.id
    try:
        meta = read_meta(message)
    except MetaError as refused:
        # A 2025-era request that names the modern key in a string (an argument): its _meta
        # carries no version, so with its session it is legacy after all.
        if request.headers.get(SESSION_HEADER) is not None and not _declares_version(message):
            raise LegacyAfterAll(refused) from None
        raise
    name = check_headers(
        message,
        meta,
        RoutingHeaders.of(request.headers),
        strict=gateway.config.listen.strict_headers,
    )
    # 6 classify: the hot paths (tools/call, tasks/*) are tested first
    spec = classify(message.method, message.id)
    seen.method = spec.method  # one of the method table's: a bounded label
    cls = spec.cls
    limits = gateway.limits
    if limits.policy.any:  # the tenant's and principal's rate, and task quotas (docs/limits.md)
        creates = cls is MethodClass.CALL_TOOL and meta.has_extension(TASKS_EXTENSION)
        tool = name if cls is MethodClass.CALL_TOOL else None
        await limits.admit(principal, creates, message.id, tool)
    if cls is MethodClass.CALL_TOOL:
        return await _call_tool(request, gateway, message, name, principal, slot, seen)
    if cls is MethodClass.TASK:
        return await _task_method(request, gateway, message, meta, principal, slot, seen)
    return await _other_method(request, gateway, message, meta, name, cls, principal, slot, seen)


async def _other_method(
    request: DownstreamRequest,
    gateway: Gateway,
    message: RPCRequest,
    meta: Meta,
    name: str | None,
    cls: MethodClass,
    principal: Principal,
    slot: int,
    seen: Exchange,
) -> Reply | Opened:
    """Step 6 for the rest of the method table: what the catalogue answers, the routed
    prompts, resources and completions, and listen."""
    catalog = gateway.catalog
    if cls is MethodClass.DISCOVER:
        return result(message, await catalog.discover_result())
    if cls is MethodClass.LIST_TOOLS:
        if message.params.get("cursor") is not None:
            raise BadCursor(request_id=message.id)  # one page, so no cursor is taskgate's
        return result(message, await catalog.tools_result(principal.tenant))
    if cls in _GATED and not await catalog.serves(_GATED[cls]):
        # A method behind a capability discover does not advertise (the core's schema,
        # MethodNotFoundError): no routed backend serves it.
        raise MethodError(
            f"Method not found: {message.method} (no routed backend serves {_GATED[cls]})",
            request_id=message.id,
        )
    if cls is MethodClass.GET_PROMPT:
        return await _get_prompt(request, gateway, message, name, principal, slot, seen)
    if cls is MethodClass.READ_RESOURCE:
        return await _read_resource(request, gateway, message, name, principal, slot, seen)
    if cls is MethodClass.COMPLETE:
        return await _complete(request, gateway, message, principal, slot, seen)
    if cls is MethodClass.LISTEN:
        return await gateway.listens.open(message, meta, principal)
    # The paged lists: the client's cursor, or BadCursor (-32602, HTTP 200)
    cursor = message.params.get("cursor")
    if cls is MethodClass.LIST_PROMPTS:
        return result(message, await catalog.prompts_result(principal.tenant, cursor))
    if cls is MethodClass.LIST_RESOURCES:
        return result(message, await catalog.resources_result(principal.tenant, cursor))
    if cls is MethodClass.LIST_TEMPLATES:
        return result(message, await catalog.templates_result(principal.tenant, cursor))
    raise AssertionError(f"the method table has a class the handler does not serve: {cls}")


async def _call_tool(
    request: DownstreamRequest,
    gateway: Gateway,
    message: RPCRequest,
    name: str | None,
    principal: Principal,
    slot: int,
    seen: Exchange,
) -> Reply:
    # 7 route: the validated name; a tool no route exposes and a tool that exists nowhere
    # get one answer, so the route table reveals nothing the catalogue would not.
    tool = required_name(name, message)
    route = await tool_route(gateway, tool, principal, message.id)
    return await _routed(request, gateway, message, tool, principal, slot, route, "tool", seen)


async def _get_prompt(
    request: DownstreamRequest,
    gateway: Gateway,
    message: RPCRequest,
    name: str | None,
    principal: Principal,
    slot: int,
    seen: Exchange,
) -> Reply:
    # 7 route, as for a tool (invariant 7)
    prompt = required_name(name, message)
    route = await prompt_route(gateway, prompt, principal, message.id)
    reply = await _routed(request, gateway, message, prompt, principal, slot, route, "prompt", seen)
    return normalised_unknown_prompt(reply, message, prompt)


async def _read_resource(
    request: DownstreamRequest,
    gateway: Gateway,
    message: RPCRequest,
    uri: str | None,
    principal: Principal,
    slot: int,
    seen: Exchange,
) -> Reply:
    # 7 route by URI (gateway/pipeline/visible.py, uri_route)
    uri = required_name(uri, message, "uri")
    route = await uri_route(gateway, uri, principal, message.id)
    reply = await _routed(request, gateway, message, uri, principal, slot, route, "resource", seen)
    return normalised_not_found(reply, message, uri)


async def _complete(
    request: DownstreamRequest,
    gateway: Gateway,
    message: RPCRequest,
    principal: Principal,
    slot: int,
    seen: Exchange,
) -> Reply:
    # 7 route by params.ref: a prompt by name, a resource template by its exact uriTemplate
    route, item = await completion_route(gateway, message, principal)
    return await _routed(request, gateway, message, None, principal, slot, route, item, seen)


async def _routed(
    request: DownstreamRequest,
    gateway: Gateway,
    message: RPCRequest,
    name: str | None,
    principal: Principal,
    slot: int,
    route: Route,
    item: str,
    seen: Exchange,
) -> Reply:
    """Steps 7-10 once a visible route names the item: its scopes, a healthy replica, the
    backend's count, then the upstream call. `name` goes upstream as Mcp-Name (None: the
    method has none, as completion/complete). Only a tools/call may create a task: its answer
    is captured (a created task is recorded before its id is relayed); any other answer is
    relayed as sent (JSON or SSE, input_required included)."""
    check_scopes(gateway, principal, route, item, message.id)
    backend = gateway.backends[route.backend]
    state = message.params.get("requestState")
    if type(state) is str and state.startswith(WAITING_PREFIX):
        # The answers to a 2025-era server's questions, for the call this process holds
        seen.backend = backend.name
        if resumes(gateway.callers.waiting, gateway.catalog.eras, backend, state, message.id):
            gateway.coordinator.route(slot, backend.name, message.id)
            return await resume(gateway.callers, message, principal, name or "", request)
    replicas = gateway.health.rotation(backend)  # new calls go to healthy replicas only
    if not replicas:
        raise Retryable(
            f"Backend {backend.name!r} has no healthy replica; retry", request_id=message.id
        )
    gateway.coordinator.route(slot, backend.name, message.id)
    seen.backend = backend.name
    capture = message.method == "tools/call"
    if capture and route.task is not None and runs_as_task(gateway, route, backend, message):
        return await call_as_task(
            request, gateway, message, name or "", principal, route, backend, replicas, seen
        )
    extra = {**backend.credentials, **backend.identity(principal.tenant, principal.subject)}
    headers = upstream_headers(request.raw_headers, name=name, extra=extra)
    eras = gateway.catalog.eras

    # 8-10 forward, capture, relay; to a replica of the 2025 era in the caller's session there
    async def attempt(replica: Replica, trace: dict[str, str] | None) -> Reply:
        bridged = eras.speaks_2025(backend, replica)
        if not bridged and eras.unknown(backend, replica):  # not asked yet (discovery asks one)
            bridged = await eras.learn(backend, replica)
        if bridged:  # with this call's trace context, when tracing is on
            own = extra if trace is None else {**extra, **trace}
            return await call_2025(
                gateway, backend, replica, message, name, principal, own, request
            )
        inspect = gateway.tasks.capture(message, replica, principal, extra) if capture else None
        sent = headers if trace is None else _traced_headers(request, name, extra, trace)
        return await forward(
            gateway.pool, replica, message, sent, backend.timeout_s, request, inspect=inspect
        )

    return await _first_reachable(gateway, replicas, attempt, seen)


async def _task_method(
    request: DownstreamRequest,
    gateway: Gateway,
    message: RPCRequest,
    meta: Meta,
    principal: Principal,
    slot: int,
    seen: Exchange,
) -> Reply:
    # 7 route: the durable task route, checked against the caller, names the owning replica
    require_extension(meta, message, TASKS_EXTENSION)
    task_id = message.params.get("taskId")
    if isinstance(task_id, str) and len(task_id) <= MAX_TASK_ID_LENGTH:
        seen.task_id = task_id  # logged hashed, so a "Task not found" can be matched to its id
        if gateway.limits.snapshots.on:  # limits.polling: a tasks/get too soon is answered here
            answered = polling.early(gateway, message, task_id, principal, seen)
            if answered is not None:
                return answered
    if is_made(task_id):  # a task taskgate runs: its record says it all, on any instance
        return await made_task_method(gateway, message, principal, seen)
    route = await gateway.tasks.resolve(task_id, principal, message.id)
    seen.backend = route.backend
    backend = gateway.backends.get(route.backend)
    if route.session and backend is not None:  # a 2025-era server's task, in its session
        gateway.coordinator.route(slot, backend.name, message.id)
        return await task_method_2025(gateway, message, route, backend, principal, seen)
    candidates = task_replicas(gateway.backends, gateway.health, route)
    if backend is None or not candidates:
        # Its owner left the configuration (a reload removed it): the task may still live
        # there, and the owner may come back, so the answer is retryable, never "not found",
        # until the route expires.
        raise Retryable(
            "The replica that owns this task is not in taskgate's configuration now; retry",
            request_id=message.id,
            retry_after_s=5,
        )
    extra = {**backend.credentials, **backend.identity(principal.tenant, principal.subject)}
    headers = upstream_headers(request.raw_headers, name=route.task_id, extra=extra)
    gateway.coordinator.route(slot, backend.name, message.id)
    inspect = polling.following(gateway, route, message, principal)
    timeout_s = backend.task_timeout_s

    # 8-10 forward and relay (capture follows a tasks/get's ttlMs)
    async def attempt(replica: Replica, trace: dict[str, str] | None) -> Reply:
        sent = headers if trace is None else _traced_headers(request, route.task_id, extra, trace)
        return await forward(
            gateway.pool,
            replica,
            message,
            sent,
            timeout_s,
            request,
            inspect=inspect,
            idempotent=True,
        )

    reply = await _first_reachable(gateway, candidates, attempt, seen)
    return owner_forgot(gateway, reply, message, route.task_id, seen)


def _traced_headers(
    request: DownstreamRequest, name: str | None, extra: dict[str, str], trace: dict[str, str]
) -> bytes:
    """The upstream header lines with this call's trace context in place of the client's."""
    return upstream_headers(request.raw_headers, name=name, extra={**extra, **trace})


async def _first_reachable(
    gateway: Gateway,
    replicas: list[Replica],
    attempt: Attempt,
    seen: Exchange,
) -> Reply:
    """The upstream attempt (gateway/upstream/attempt.py), each call in a client span of its
    own when tracing is on, its context sent upstream."""
    span = seen.span
    if span is not None:
        attempt = span.traced(attempt)
    return await first_reachable(gateway.health, replicas, attempt, seen)


def _declares_version(message: RPCRequest) -> bool:
    meta = message.params.get("_meta")
    return isinstance(meta, dict) and PROTOCOL_VERSION_KEY in meta


def _accepted(notification: RPCNotification) -> Reply:
    # The 2026-07-28 core defines no client-to-server notification over HTTP; one that parses
    # is accepted and dropped, which is what a direct 2026-07-28 server does with it
    # (docs/decisions.md, 5).
    log.debug("accepted notification %s", notification.method)
    return DownstreamResponse(status=202)
