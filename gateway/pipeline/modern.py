"""POST /mcp: the one module that orders the steps of a request, and reads as the pipeline.

The numbered comments are the steps of docs/architecture.md, "The path of a request".
"""

from __future__ import annotations

import logging
from time import perf_counter
from typing import Any, Literal

import orjson

from gateway.auth import Principal
from gateway.catalog.table import Route
from gateway.errors import (
    BadCursor,
    BadGateway,
    GatewayError,
    HTTPRefusal,
    Retryable,
    TaskNotFound,
    UpstreamUnavailable,
    UpstreamUnreachable,
    from_protocol,
)
from gateway.h1.server import DownstreamRequest, DownstreamResponse, Refused, Reply
from gateway.legacy.wire import SESSION_HEADER, is_modern
from gateway.listen.hub import Opened
from gateway.observe.access import task_hash
from gateway.observe.exchange import Exchange
from gateway.observe.trace import Attempt, trace_id
from gateway.pipeline import legacy
from gateway.pipeline.state import Gateway
from gateway.pipeline.visible import (
    backend_error,
    check_scopes,
    completion_route,
    normalised_not_found,
    normalised_unknown_prompt,
    prompt_route,
    required_name,
    tool_route,
    uri_route,
)
from gateway.protocol import envelope
from gateway.protocol.accept import acceptable
from gateway.protocol.codes import Code, MetaError, MethodError, ProtocolError
from gateway.protocol.envelope import RPCNotification, RPCRequest
from gateway.protocol.headers import RoutingHeaders, check_headers
from gateway.protocol.meta import (
    PROTOCOL_VERSION_KEY,
    TASKS_EXTENSION,
    Meta,
    read_meta,
    require_extension,
)
from gateway.protocol.methods import MethodClass, classify
from gateway.protocol.tasks import MAX_TASK_ID_LENGTH
from gateway.upstream.health import task_replicas
from gateway.upstream.relay import JSON, forward, upstream_headers
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


# What the request log and the metrics say of a request whose client left before its answer
# (never sent): nginx's 499, "client closed request".
_CLIENT_LEFT = DownstreamResponse(status=499, body=b"", content_type="")
_STREAM_ENDED = DownstreamResponse(status=200, body=b"", content_type="")


async def handle_post(gateway: Gateway, request: DownstreamRequest) -> Reply:
    """The pipeline, then the request's record: counted, logged, kept when it failed."""
    exchange = Exchange()
    headers = request.headers
    tracer = gateway.observer.tracer
    if tracer is None:
        exchange.trace_id = trace_id(headers.get("traceparent"))
    else:  # the request's span, continuing the client's trace or starting one
        exchange.span = tracer.request(exchange, headers)
    try:
        reply = await _handle(gateway, request, exchange)
    except BaseException as exc:  # cancelled: the client left before its answer
        if exchange.span is not None:
            exchange.span.abandon(exchange, exc)
            exchange.span = None  # ended
        if exchange.method == "subscriptions/listen" or exchange.answered:
            # a listen ends when its client leaves; so may a stream whose answer was sent
            gateway.observer.finish(exchange, _STREAM_ENDED)
        else:
            exchange.message = "the client left before its answer"
            gateway.observer.finish(exchange, _CLIENT_LEFT)
        raise
    gateway.observer.finish(exchange, reply)  # which ends the span, if any
    return reply


async def _handle(gateway: Gateway, request: DownstreamRequest, seen: Exchange) -> Reply:
    try:
        # 1 authenticate first: a caller without a valid token learns nothing but 401, except
        # that a present, disallowed Origin is 403 whatever the token (the core's MUST,
        # basic/transports/streamable-http, Security; docs/decisions.md, 14)
        _check_origin(request, gateway)
        principal = await gateway.auth.authenticate(request.headers.getall("Authorization"))
        seen.tenant = principal.tenant
        _admit(request, gateway)  # 2 admit: transport checks before the body
        body = await _read_body(request)  # 3 read the body
        # 4 the coordinator admits the request once it has arrived whole, or refuses it at once
        # (503, Retry-After): a client that trickles its body holds no slot while it does, and
        # no tenant holds more than its share (docs/decisions.md, 35).
        with gateway.coordinator.request(principal.tenant) as slot:
            reply = await _pipeline(request, body, gateway, principal, slot, seen)
        if isinstance(reply, Opened):
            # A listen stream lasts as long as its client: it holds no coordinator slot.
            return await gateway.listens.serve(request, reply)
        return reply
    except ProtocolError as refused:
        return _failed(seen, from_protocol(refused))
    except GatewayError as failed:
        if failed.request_id is None:  # raised where the id is not known (discovery, the store)
            failed.request_id = seen.request_id
        return _failed(seen, failed)
    except Exception:
        log.exception("unexpected failure while serving a request")
        return _failed(seen, GatewayError("Internal error", request_id=seen.request_id))


async def _pipeline(
    request: DownstreamRequest,
    body: bytes,
    gateway: Gateway,
    principal: Principal,
    slot: int,
    seen: Exchange,
) -> Reply | Opened:
    # 5 parse: envelope, then _meta, then the version header against the body, then the
    # version, then the other headers against the body (check_headers; docs/decisions.md, 1)
    # The era, by the body: a 2026-07-28 request carries its version in params._meta.
    # Without it, initialize, a session, a batch or a posted response is the 2025 era; any
    # other body goes on to the modern checks, which name what it lacks.
    front = gateway.legacy
    if not is_modern(body) and _looks_legacy(request, body):
        if front is not None:
            return await legacy.post(gateway, front, request, body, principal, slot, seen)
        raise legacy.refuse(None)
    message = envelope.parse(body, max_depth=gateway.config.listen.max_json_depth)
    if isinstance(message, RPCNotification):
        seen.method = "notification"
        return _accepted(message)
    seen.request_id = message.id
    try:
        meta = read_meta(message)
    except MetaError:
        # A 2025-era request that names the modern key in a string (an argument): its _meta
        # carries no version, so with its session it is legacy after all.
        session = request.headers.get(SESSION_HEADER)
        if front is not None and session is not None and not _declares_version(message):
            return await legacy.post(gateway, front, request, body, principal, slot, seen)
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
    if cls is MethodClass.CALL_TOOL:
        return await _call_tool(request, gateway, message, name, principal, slot, seen)
    if cls is MethodClass.TASK:
        return await _task_method(request, gateway, message, meta, principal, slot, seen)
    catalog = gateway.catalog
    if cls is MethodClass.DISCOVER:
        return _result(message, await catalog.discover_result())
    if cls is MethodClass.LIST_TOOLS:
        if message.params.get("cursor") is not None:
            raise BadCursor(request_id=message.id)  # one page, so no cursor is taskgate's
        return _result(message, await catalog.tools_result(principal.tenant))
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
        return _result(message, await catalog.prompts_result(principal.tenant, cursor))
    if cls is MethodClass.LIST_RESOURCES:
        return _result(message, await catalog.resources_result(principal.tenant, cursor))
    if cls is MethodClass.LIST_TEMPLATES:
        return _result(message, await catalog.templates_result(principal.tenant, cursor))
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
    replicas = gateway.health.rotation(backend)  # new calls go to healthy replicas only
    if not replicas:
        raise Retryable(
            f"Backend {backend.name!r} has no healthy replica; retry", request_id=message.id
        )
    gateway.coordinator.route(slot, backend.name, message.id)
    seen.backend = backend.name
    extra = {**backend.credentials, **backend.identity(principal.tenant, principal.subject)}
    headers = upstream_headers(request.raw_headers, name=name, extra=extra)
    capture = message.method == "tools/call"

    # 8-10 forward, capture, relay
    async def attempt(replica: Replica, trace: dict[str, str] | None) -> Reply:
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
    route = await gateway.tasks.resolve(task_id, principal, message.id)
    seen.backend = route.backend
    backend = gateway.backends.get(route.backend)
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
    # tasks/get answers move the route's expiry when ttlMs changes
    inspect = gateway.tasks.follow(route, message) if message.method == "tasks/get" else None
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
    return _owner_forgot(gateway, reply, message, route.task_id, seen)


def _owner_forgot(
    gateway: Gateway, reply: Reply, message: RPCRequest, task_id: str, seen: Exchange
) -> Reply:
    """The owner's own "not found" (it lost the task, e.g. on restart: FastMCP answers HTTP 400
    "Task <id> not found") becomes the one answer of a task that does not exist (README). The
    operator still tells it from a lost route: the request log names the replica that answered
    (a route taskgate lost never reaches one), and taskgate_task_routes_total counts it as
    owner_lost (docs/decisions.md, 31)."""
    error = backend_error(reply, message)
    if error is None or error.get("code") != Code.INVALID_PARAMS:
        return reply
    text = error.get("message")
    if not isinstance(text, str) or "not found" not in text.lower() or "task" not in text.lower():
        return reply
    gateway.tasks.outcomes["owner_lost"] += 1
    log.info(
        "replica %s of %s no longer knows task %s; answered as an unknown task",
        seen.replica,
        seen.backend,
        task_hash(task_id),
    )
    return _failed(seen, TaskNotFound(message.id))


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
    """Try replicas in order, moving on only when one refused the connection: such a call
    certainly never reached it, so even a non-idempotent tools/call is safe to send again.

    What the replica did reports to its health (passive ejection); what the client or taskgate
    caused does not (docs/operations.md, "What counts against a replica"). Against it: no
    connection, a broken or malformed answer (BadGateway), a 5xx, a timeout of an idempotent
    call (UpstreamUnavailable). Neither way: a 4xx (the backend refused the client's request),
    a tools/call past its deadline (UpstreamTimeout: the tool may be slow for that input), a
    store that could not record a task (a Retryable of taskgate's own), the client leaving."""
    span = seen.span
    if span is not None:  # each attempt in a client span of its own, its context sent upstream
        attempt = span.traced(attempt)
    for index, replica in enumerate(replicas):
        seen.replica = replica.label
        started = perf_counter()
        try:
            response = await attempt(replica, None)
        except UpstreamUnreachable as exc:
            seen.upstream_s = perf_counter() - started
            gateway.health.failure(replica)
            if index == len(replicas) - 1:
                raise
            log.warning("%s; trying the next replica", exc.message)
            continue
        except (UpstreamUnavailable, BadGateway):
            seen.upstream_s = perf_counter() - started
            gateway.health.failure(replica)
            raise
        seen.upstream_s = perf_counter() - started
        status = response.status
        if status < 400:
            gateway.health.success(replica)
        elif status >= 500:
            gateway.health.failure(replica)
        return response
    raise AssertionError("a route always has at least one replica")


def _looks_legacy(request: DownstreamRequest, body: bytes) -> bool:
    """Whether a body without the modern version is of the 2025 era (with legacy off, such a
    request is refused naming the revision served): a session header, initialize, a batch, or
    a posted response. Anything else goes on to the modern checks, which name what is missing."""
    if request.headers.get(SESSION_HEADER) is not None or body.lstrip()[:1] == b"[":
        return True
    if b'"initialize"' in body:
        return True
    return b'"method"' not in body and (b'"result"' in body or b'"error"' in body)


def _declares_version(message: RPCRequest) -> bool:
    meta = message.params.get("_meta")
    return isinstance(meta, dict) and PROTOCOL_VERSION_KEY in meta


async def handle_session_request(gateway: Gateway, request: DownstreamRequest) -> Reply:
    """GET (the stream) and DELETE (the end) of a 2025-era session, recorded like a POST."""
    exchange = Exchange()
    exchange.method = request.method  # GET or DELETE: a bounded label
    try:
        reply = await _session_request(gateway, request, exchange)
    except BaseException:  # cancelled: the client left; a GET stream ends that way
        gateway.observer.finish(
            exchange, _STREAM_ENDED if request.method == "GET" else _CLIENT_LEFT
        )
        raise
    gateway.observer.finish(exchange, reply)
    return reply


async def _session_request(gateway: Gateway, request: DownstreamRequest, seen: Exchange) -> Reply:
    front = gateway.legacy
    assert front is not None  # the dispatcher sends GET and DELETE here only when it is on
    try:
        _check_origin(request, gateway)
        principal = await gateway.auth.authenticate(request.headers.getall("Authorization"))
        seen.tenant = principal.tenant
        if not gateway.guard.host_allowed(request.headers.get("Host")):
            raise HTTPRefusal("Forbidden: this Host name is not served here", status=403)
        header = request.headers.get(SESSION_HEADER)
        session = await front.sessions.find(header, principal, None, fresh=True)
        if request.method == "DELETE":
            await front.upstreams.end(session, gateway.backends)
            return DownstreamResponse(status=200)
        accept = request.headers.getall("Accept")
        if not any("text/event-stream" in value or "*/*" in value for value in accept):
            raise HTTPRefusal(
                "Not acceptable: the GET stream is text/event-stream; the Accept header must "
                "admit it",
                status=406,
            )
        return await front.streams.serve(
            request,
            session,
            principal,
            front.sessions,
            gateway.backends,
            gateway.listens.lists,
            gateway.config.subscriptions.keepalive_s,
        )
    except GatewayError as exc:
        return _failed(seen, exc)
    except Exception:
        log.exception("unexpected failure while serving a 2025-era session request")
        return _failed(seen, GatewayError("Internal error"))


def _check_origin(request: DownstreamRequest, gateway: Gateway) -> None:
    if not gateway.guard.origin_allowed(request.headers.get("Origin")):
        raise HTTPRefusal("Forbidden: this Origin may not call taskgate", status=403)


def _admit(request: DownstreamRequest, gateway: Gateway) -> None:
    """Transport checks that come before the body: Origin, Host, Content-Type, Accept. The
    last two refuse what a backend would refuse before reading a body (FastMCP: 400 for the
    Content-Type, a bare 406 for Accept), so that it is refused here, in JSON-RPC, with no
    replica involved. A request without Accept passes: taskgate sends one upstream."""
    headers = request.headers
    if not gateway.guard.host_allowed(headers.get("Host")):
        raise HTTPRefusal("Forbidden: this Host name is not served here", status=403)
    if request.content_type != JSON:
        raise HTTPRefusal("Unsupported media type: the body must be application/json", status=415)
    accept = headers.getall("Accept")
    if accept and not acceptable(accept):
        raise HTTPRefusal(_NOT_ACCEPTABLE, status=406)


_NOT_ACCEPTABLE = (
    "Not acceptable: the Accept header must admit both application/json and text/event-stream"
)


async def _read_body(request: DownstreamRequest) -> bytes:
    """The body, read whole: the server bounds its size (413, at once when Content-Length
    says so) and the time it may take (408). No coordinator slot is held meanwhile."""
    try:
        return await request.read()
    except Refused as exc:
        if exc.status == 503:  # taskgate holds as many request bytes as it may, for now
            raise Retryable(exc.reason) from None
        raise HTTPRefusal(exc.reason, status=exc.status) from None


def _accepted(notification: RPCNotification) -> Reply:
    # The 2026-07-28 core defines no client-to-server notification over HTTP; one that parses
    # is accepted and dropped, which is what a direct 2026-07-28 server does with it
    # (docs/decisions.md, 5).
    log.debug("accepted notification %s", notification.method)
    return DownstreamResponse(status=202)


def _result(message: RPCRequest, result: dict[str, Any]) -> DownstreamResponse:
    body = orjson.dumps({"jsonrpc": "2.0", "id": message.id, "result": result})
    return DownstreamResponse(body=body, content_type=JSON)


def _failed(seen: Exchange, exc: GatewayError) -> DownstreamResponse:
    seen.code = exc.code
    seen.message = exc.message
    return _error(exc)


def _error(exc: GatewayError) -> DownstreamResponse:
    return DownstreamResponse(
        status=exc.status, body=exc.body(), content_type=JSON, headers=exc.headers
    )


async def method_not_allowed(gateway: Gateway, request: DownstreamRequest) -> DownstreamResponse:
    """GET, DELETE and the rest: a 2026-07-28 endpoint has no stream to open and no session to
    end; the caller is authenticated first (after the Origin), so that nothing answers an
    unauthenticated one but 401."""
    try:
        _check_origin(request, gateway)
        await gateway.auth.authenticate(request.headers.getall("Authorization"))
    except GatewayError as refused:
        return _error(refused)
    exc = HTTPRefusal(
        f"Method not allowed: {request.method}; MCP 2026-07-28 uses POST only",
        status=405,
        headers={"Allow": "POST"},
    )
    return _error(exc)
