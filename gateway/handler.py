"""POST /mcp: the one module that orders the steps of a request, and reads as the pipeline.

The numbered comments are the steps of docs/architecture.md, "The path of a request".
"""

from __future__ import annotations

import logging
from time import perf_counter
from typing import Any, Literal

import orjson

from gateway.auth import Principal
from gateway.auth.metadata import challenge
from gateway.errors import (
    BadCursor,
    BadGateway,
    GatewayError,
    HTTPRefusal,
    InBandError,
    InsufficientScope,
    ResourceNotFound,
    Retryable,
    UnknownPrompt,
    UnknownTool,
    UpstreamUnavailable,
    UpstreamUnreachable,
    from_protocol,
)
from gateway.h1.server import DownstreamRequest, DownstreamResponse, Refused, Reply
from gateway.listen.hub import Opened
from gateway.observe.access import task_hash
from gateway.observe.exchange import Exchange
from gateway.observe.trace import Attempt, trace_id
from gateway.protocol import envelope
from gateway.protocol.accept import acceptable
from gateway.protocol.codes import Code, MethodError, ProtocolError
from gateway.protocol.envelope import RPCNotification, RPCRequest
from gateway.protocol.headers import RoutingHeaders, check_headers
from gateway.protocol.meta import (
    TASKS_EXTENSION,
    Meta,
    read_meta,
    require_extension,
)
from gateway.protocol.methods import MethodClass, classify
from gateway.protocol.tasks import MAX_TASK_ID_LENGTH
from gateway.relay import JSON, forward, upstream_headers
from gateway.routing.health import task_replicas
from gateway.routing.replicas import Replica
from gateway.routing.table import Route
from gateway.state import Gateway
from gateway.taskroutes import TaskNotFound

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
        if exchange.method == "subscriptions/listen":  # a listen ends when its client leaves
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
        # (503, Retry-After): a client that trickles its body holds no slot while it does.
        with gateway.coordinator.request() as slot:
            reply = await _pipeline(request, body, gateway, principal, slot, seen)
        if isinstance(reply, Opened):
            # A listen stream lasts as long as its client: it holds no coordinator slot.
            return await gateway.listens.serve(request, reply)
        return reply
    except ProtocolError as exc:
        return _failed(seen, from_protocol(exc))
    except GatewayError as exc:
        if exc.request_id is None:  # raised where the id is not known (discovery, the store)
            exc.request_id = seen.request_id
        return _failed(seen, exc)
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
    message = envelope.parse(body, max_depth=gateway.config.listen.max_json_depth)
    if isinstance(message, RPCNotification):
        seen.method = "notification"
        return _accepted(message)
    seen.request_id = message.id
    meta = read_meta(message)
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
    tool = _required_name(name, message)
    route = gateway.routes.lookup(tool, principal.tenant)
    if route is None or await gateway.catalog.knows(route.backend, tool) is False:
        raise UnknownTool(tool, request_id=message.id)
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
    # 7 route, as for a tool: a prompt no visible route exposes, or that its backend does not
    # list, answers like one that exists nowhere (invariant 7).
    prompt = _required_name(name, message)
    route = gateway.routes.lookup_prompt(prompt, principal.tenant)
    if route is None or await gateway.catalog.knows_prompt(route.backend, prompt) is False:
        raise UnknownPrompt(prompt, request_id=message.id)
    reply = await _routed(request, gateway, message, prompt, principal, slot, route, "prompt", seen)
    return _normalised_unknown_prompt(reply, message, prompt)


async def _read_resource(
    request: DownstreamRequest,
    gateway: Gateway,
    message: RPCRequest,
    uri: str | None,
    principal: Principal,
    slot: int,
    seen: Exchange,
) -> Reply:
    # 7 route by URI: a route naming it (exact or glob) whose backend lists it; else the first
    # visible route with a template that could produce it, whose backend lists that template.
    # Anything else answers like a URI that exists nowhere (invariant 7).
    uri = _required_name(uri, message, "uri")
    route = await gateway.catalog.resource_route(uri, principal.tenant)
    if route is None:
        raise ResourceNotFound(uri, request_id=message.id)
    reply = await _routed(request, gateway, message, uri, principal, slot, route, "resource", seen)
    return _normalised_not_found(reply, message, uri)


def _normalised_not_found(reply: Reply, message: RPCRequest, uri: str) -> Reply:
    """The backend's own not-found for this URI (FastMCP: HTTP 400, -32602 "Resource not
    found: '<uri>'", data.uri) becomes taskgate's, so that a routed URI the backend refuses
    answers exactly like one no route exposes."""
    error = _backend_error(reply, message)
    if (
        error is not None
        and error.get("code") == Code.INVALID_PARAMS
        and isinstance(error.get("data"), dict)
        and error["data"].get("uri") == uri
    ):
        return _error(ResourceNotFound(uri, request_id=message.id))
    return reply


def _normalised_unknown_prompt(reply: Reply, message: RPCRequest, name: str) -> Reply:
    """The backend's own unknown-prompt (FastMCP: HTTP 400, -32602 "Unknown prompt: '<name>'",
    no data), for a prompt taskgate's catalogue still lists, becomes taskgate's. Only those two
    exact messages: a -32602 about the prompt's arguments is the backend's answer, relayed."""
    error = _backend_error(reply, message)
    if (
        error is not None
        and error.get("code") == Code.INVALID_PARAMS
        and error.get("message") in (f"Unknown prompt: {name}", f"Unknown prompt: {name!r}")
    ):
        return _error(UnknownPrompt(name, request_id=message.id))
    return reply


def _backend_error(reply: Reply, message: RPCRequest) -> dict[str, Any] | None:
    """The error object of a backend's whole JSON answer to `message`, or None (a result, a
    stream, or a body that is not a JSON-RPC answer to this id)."""
    if not isinstance(reply, DownstreamResponse) or reply.content_type != JSON:
        return None
    if reply.status == 200 and b'"error"' not in reply.body:
        return None
    try:
        answer = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(answer, dict) or answer.get("id") != message.id:
        return None
    error = answer.get("error")
    return error if isinstance(error, dict) else None


async def _complete(
    request: DownstreamRequest,
    gateway: Gateway,
    message: RPCRequest,
    principal: Principal,
    slot: int,
    seen: Exchange,
) -> Reply:
    # 7 route by params.ref: a prompt by name, a resource template by its exact uriTemplate. A
    # ref no visible route exposes answers as prompts/get or resources/read of it would.
    given = message.params.get("ref")
    ref: dict[str, Any] = given if isinstance(given, dict) else {}
    kind = ref.get("type")
    catalog = gateway.catalog
    tenant = principal.tenant
    if kind == "ref/prompt" and isinstance(name := ref.get("name"), str):
        route = gateway.routes.lookup_prompt(name, tenant)
        if route is None or await catalog.knows_prompt(route.backend, name) is False:
            raise UnknownPrompt(name, request_id=message.id)
        return await _routed(
            request, gateway, message, None, principal, slot, route, "prompt", seen
        )
    if kind == "ref/resource" and isinstance(uri := ref.get("uri"), str):
        route = gateway.routes.lookup_template(uri, tenant)
        if route is None or await catalog.knows_template(route.backend, uri) is False:
            raise ResourceNotFound(uri, request_id=message.id)
        return await _routed(
            request, gateway, message, None, principal, slot, route, "resource", seen
        )
    raise InBandError(
        "Invalid params: params.ref must be a prompt or resource reference",
        request_id=message.id,
        code=Code.INVALID_PARAMS,
    )


def _required_name(name: str | None, message: RPCRequest, param: str = "name") -> str:
    if name is None:
        raise InBandError(
            f"Invalid params: params.{param} must be a string",
            request_id=message.id,
            code=Code.INVALID_PARAMS,
        )
    return name


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
    # Tenants decide what is visible; scopes decide what a visible item lets the token do.
    if not principal.scopes.issuperset(route.scopes):
        www = challenge(gateway.auth.metadata_url, error="insufficient_scope", scopes=route.scopes)
        raise InsufficientScope(route.scopes, www, message.id, item=item)
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
    error = _backend_error(reply, message)
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
