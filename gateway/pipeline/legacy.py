"""POST, GET and DELETE of 2025-era clients: the handshake and lists answered by taskgate, calls
relayed on upstream sessions, the client's answers and notifications delivered to the backends
they concern, the session ended with DELETE.

Authentication, Origin, Host, Content-Type and Accept are checked before this module runs, in
gateway/pipeline/modern.py, exactly as for modern traffic; so are the coordinator's limits.
"""

from __future__ import annotations

import asyncio
import logging
from time import perf_counter
from typing import Any

import orjson

from gateway.auth import Principal
from gateway.catalog.discovery import SERVER_INFO
from gateway.catalog.table import Route
from gateway.errors import (
    BadCursor,
    BadGateway,
    GatewayError,
    HTTPRefusal,
    InBandError,
    Retryable,
    UpstreamTimeout,
    UpstreamUnavailable,
    UpstreamUnreachable,
)
from gateway.h1.server import DownstreamRequest, DownstreamResponse, Reply
from gateway.legacy import wire
from gateway.legacy.door import FrontDoor
from gateway.legacy.sessions import SessionNotFound
from gateway.legacy.upstreams import own_headers, session_headers
from gateway.legacy.wire import (
    LEGACY_VERSIONS,
    SESSION_HEADER,
    VERSION_HEADER,
    LegacyMessage,
    RPCAnswer,
)
from gateway.observe.exchange import Exchange
from gateway.pipeline.state import Gateway
from gateway.pipeline.visible import (
    check_scopes,
    completion_route,
    normalised_not_found,
    normalised_unknown_prompt,
    prompt_route,
    required_name,
    tool_route,
    uri_route,
)
from gateway.protocol.codes import Code, RequestId
from gateway.protocol.envelope import RPCNotification, RPCRequest
from gateway.protocol.sse import FrameTooLarge, SSEDecoder
from gateway.store.sessions import LegacySession
from gateway.upstream.connection import (
    DeadlineExceeded,
    ExchangeError,
    Unreachable,
    UpstreamResponse,
)
from gateway.upstream.relay import JSON, Rewriter, forward, upstream_headers
from gateway.upstream.replicas import Replica

log = logging.getLogger("taskgate.legacy")

# The methods a 2025-era client may send, as metric labels; anything else counts as "other".
_LABELS = frozenset(
    {
        "initialize",
        "ping",
        "tools/list",
        "tools/call",
        "prompts/list",
        "prompts/get",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "completion/complete",
    }
)
# Requests relayed on an upstream session (the others taskgate answers itself).
_RELAYED = frozenset({"tools/call", "prompts/get", "resources/read", "completion/complete"})
_GATED = {
    "prompts/list": "prompts",
    "prompts/get": "prompts",
    "resources/list": "resources",
    "resources/templates/list": "resources",
    "resources/read": "resources",
    "completion/complete": "completions",
}
_ACCEPTED = DownstreamResponse(status=202)
# What a 2025-era client asks that taskgate does not carry, with the reason the error names.
_NOT_SERVED = {
    "tasks/get": "legacy tasks are not served through taskgate",
    "tasks/result": "legacy tasks are not served through taskgate",
    "tasks/list": "legacy tasks are not served through taskgate",
    "tasks/cancel": "legacy tasks are not served through taskgate",
    "resources/subscribe": "taskgate relays no 2025-era resource subscriptions",
    "resources/unsubscribe": "taskgate relays no 2025-era resource subscriptions",
    "logging/setLevel": "taskgate does not relay logging levels",
}


async def post(
    gateway: Gateway,
    front: FrontDoor,
    request: DownstreamRequest,
    body: bytes,
    principal: Principal,
    slot: int,
    seen: Exchange,
) -> Reply:
    """One 2025-era POST: a message, or a batch of them (2025-03-26)."""
    parsed = wire.parse(body, max_depth=gateway.config.listen.max_json_depth)
    if isinstance(parsed, list):
        seen.method = "batch"
        return await _batch(gateway, front, request, parsed, principal, slot, seen)
    if isinstance(parsed, RPCRequest) and parsed.method == "initialize":
        seen.method = "initialize"
        seen.request_id = parsed.id
        return await _initialize(gateway, front, parsed, principal)
    request_id = parsed.id if not isinstance(parsed, RPCNotification) else None
    # Only a relayed request may use this instance's last read of the session (a session ended
    # elsewhere has had its upstream sessions ended, so the backend answers 404 for it); all
    # else reads the store: taskgate's own answers, and answers and notifications that must
    # reach upstream sessions bound anywhere.
    fresh = not (isinstance(parsed, RPCRequest) and parsed.method in _RELAYED)
    session = await front.sessions.find(
        request.headers.get(SESSION_HEADER), principal, request_id, fresh=fresh
    )
    _check_version(request, session, request_id)
    return await _message(gateway, front, request, parsed, session, principal, slot, seen)


async def _message(
    gateway: Gateway,
    front: FrontDoor,
    request: DownstreamRequest,
    message: LegacyMessage,
    session: LegacySession,
    principal: Principal,
    slot: int,
    seen: Exchange,
    *,
    whole: bool = False,
) -> Reply:
    if isinstance(message, RPCAnswer):
        seen.method = "response"
        return await _deliver_answer(gateway, front, message, session, principal)
    if isinstance(message, RPCNotification):
        seen.method = "notification"
        if message.method != "notifications/initialized":  # taskgate sent its own upstream
            await front.upstreams.fan_out(session, gateway.backends, principal, message.body)
        return _ACCEPTED
    seen.request_id = message.id
    method = message.method
    seen.method = method if method in _LABELS else "other"
    if method in _NOT_SERVED or method == "initialize":
        why = _NOT_SERVED.get(method, "the session is initialized already")
        raise InBandError(
            f"Method not found: {method} ({why})",
            request_id=message.id,
            code=Code.METHOD_NOT_FOUND,
        )
    catalog = gateway.catalog
    tenant = principal.tenant
    if method == "ping":
        return _result(message.id, {})
    capability = _GATED.get(method)
    if capability is not None and not await catalog.serves(capability):  # type: ignore[arg-type]
        raise InBandError(
            f"Method not found: {method} (no routed backend serves {capability})",
            request_id=message.id,
            code=Code.METHOD_NOT_FOUND,
        )
    if method == "tools/list":
        if message.params.get("cursor") is not None:
            raise BadCursor(request_id=message.id)  # one page, so no cursor is taskgate's
        return _result(message.id, wire.legacy_result(await catalog.tools_result(tenant)))
    cursor = message.params.get("cursor")
    if method == "prompts/list":
        return _result(message.id, wire.legacy_result(await catalog.prompts_result(tenant, cursor)))
    if method == "resources/list":
        listed = await catalog.resources_result(tenant, cursor)
        return _result(message.id, wire.legacy_result(listed))
    if method == "resources/templates/list":
        listed = await catalog.templates_result(tenant, cursor)
        return _result(message.id, wire.legacy_result(listed))
    route: Route
    if method == "tools/call":
        tool = required_name(message.params.get("name"), message)
        route = await tool_route(gateway, tool, principal, message.id)
        outgoing = RPCRequest(message.id, method, message.params, wire.without_task(message))
        return await _relayed(
            gateway, front, request, outgoing, session, principal, slot, route, "tool", seen, whole
        )
    if method == "prompts/get":
        name = required_name(message.params.get("name"), message)
        route = await prompt_route(gateway, name, principal, message.id)
        reply = await _relayed(
            gateway, front, request, message, session, principal, slot, route, "prompt", seen, whole
        )
        return normalised_unknown_prompt(reply, message, name)
    if method == "resources/read":
        uri = required_name(message.params.get("uri"), message, "uri")
        route = await uri_route(gateway, uri, principal, message.id)
        reply = await _relayed(
            gateway,
            front,
            request,
            message,
            session,
            principal,
            slot,
            route,
            "resource",
            seen,
            whole,
        )
        return normalised_not_found(reply, message, uri)
    if method == "completion/complete":
        route, item = await completion_route(gateway, message, principal)
        return await _relayed(
            gateway, front, request, message, session, principal, slot, route, item, seen, whole
        )
    raise InBandError(
        f"Method not found: {method} (taskgate does not serve this method)",
        request_id=message.id,
        code=Code.METHOD_NOT_FOUND,
    )


async def _initialize(
    gateway: Gateway, front: FrontDoor, message: RPCRequest, principal: Principal
) -> Reply:
    """taskgate's own session: the client's revision if it is of the 2025 era, else the newest;
    capabilities from what the routes expose; no upstream session yet (each opens on first
    use). The id goes back in Mcp-Session-Id."""
    params = message.params
    capabilities = params.get("capabilities", {})
    client_info = params.get("clientInfo", {})
    if not isinstance(capabilities, dict) or not isinstance(client_info, dict):
        raise InBandError(
            "Invalid params: initialize needs capabilities and clientInfo objects",
            request_id=message.id,
            code=Code.INVALID_PARAMS,
        )
    version = wire.negotiated(params.get("protocolVersion"))
    discovered = await gateway.catalog.discover_result()  # retryable when no backend answers
    declared = {"capabilities": capabilities, "clientInfo": client_info}
    session, evicted = await front.sessions.open(principal, version, declared, message.id)
    for old in evicted:  # the caller's least recently used sessions, ended to make room
        front.upstreams.end_upstreams_later(old, gateway.backends)
    result = wire.initialize_result(version, discovered["capabilities"], SERVER_INFO)
    return DownstreamResponse(
        body=wire.answer(message.id, result),
        content_type=JSON,
        headers={SESSION_HEADER: session.session_id},
    )


async def _relayed(
    gateway: Gateway,
    front: FrontDoor,
    request: DownstreamRequest,
    message: RPCRequest,
    session: LegacySession,
    principal: Principal,
    slot: int,
    route: Route,
    item: str,
    seen: Exchange,
    whole: bool,
) -> Reply:
    """A routed request on the backend's upstream session of this client session (opened now
    when it is the first): its answer relayed as it comes, with the backend's requests to the
    client under namespaced ids. `whole`: the answer's last message as JSON (in a batch)."""
    check_scopes(gateway, principal, route, item, message.id)
    backend = gateway.backends[route.backend]
    seen.backend = backend.name
    candidates = gateway.health.rotation(backend)
    if not candidates and backend.name not in session.upstreams:
        raise Retryable(
            f"Backend {backend.name!r} has no healthy replica; retry", request_id=message.id
        )
    replica, upstream = await front.upstreams.bound(
        session, backend, candidates, principal, message.id
    )
    if not upstream.session_id:
        # A stateless backend has no session that a DELETE elsewhere could end: the store says
        # whether the client's session is still live.
        await front.sessions.find(session.session_id, principal, message.id, fresh=True)
    gateway.coordinator.route(slot, backend.name, message.id)
    seen.replica = replica.label
    extra = {
        **own_headers(backend, principal),
        **session_headers(upstream, session.protocol_version),
    }
    headers = upstream_headers(request.raw_headers, name=None, extra=extra)
    name = backend.name
    started = perf_counter()
    reply: Reply
    try:
        if whole:
            reply = await _whole_answer(gateway, replica, message, headers, backend.timeout_s)
        else:
            reply = await forward(
                gateway.pool,
                replica,
                message,
                headers,
                backend.timeout_s,
                request,
                rewrite=_rewriter(name, seen),
            )
    except UpstreamUnreachable:
        # The replica holding the upstream session is gone, and the session with it: the
        # client's session cannot go on (the revision's 404; the client initializes again).
        seen.upstream_s = perf_counter() - started
        gateway.health.failure(replica)
        await front.upstreams.end(session, gateway.backends, lost=True)
        raise SessionNotFound(message.id) from None
    except (UpstreamUnavailable, BadGateway):
        seen.upstream_s = perf_counter() - started
        gateway.health.failure(replica)
        raise
    seen.upstream_s = perf_counter() - started
    status = reply.status
    if status == 404 and isinstance(reply, DownstreamResponse):
        # The backend no longer knows the upstream session (it restarted, or ended it).
        log.info("%s of %s lost a 2025-era session; the client's session ends", replica.label, name)
        await front.upstreams.end(session, gateway.backends, lost=True)
        raise SessionNotFound(message.id)
    if status < 400:
        gateway.health.success(replica)
    elif status >= 500:
        gateway.health.failure(replica)
    return reply


def _rewriter(backend: str, seen: Exchange) -> Rewriter:
    """Each message of a relayed event stream: a backend's request namespaced; the answer
    noted, so that a client closing the stream after it is not counted as having left."""

    def rewrite(data: bytes) -> bytes:
        if not seen.answered and b'"method"' not in data:
            seen.answered = True  # the one response a request's stream carries is its answer
        return wire.rewrite_request(data, backend)

    return rewrite


async def _whole_answer(
    gateway: Gateway, replica: Replica, message: RPCRequest, headers: bytes, timeout_s: float
) -> DownstreamResponse:
    """A batch member's call, its answer read whole (a batch is answered with one JSON array, so
    a backend's requests to the client cannot reach it: send such calls alone)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    upstream: UpstreamResponse | None = None
    try:
        upstream = await gateway.pool.post(
            replica.url, headers, message.body, deadline=deadline, idempotent=False
        )
        content_type = (upstream.header(b"content-type") or "").partition(";")[0].strip().lower()
        if content_type != "text/event-stream":
            body = await upstream.read(replica.max_answer_bytes)
            return DownstreamResponse(upstream.status, body, JSON if body else None)
        return DownstreamResponse(upstream.status, await _final_event(upstream, message), JSON)
    except Unreachable as exc:
        raise UpstreamUnreachable(
            f"Backend {replica.backend!r} is unreachable ({replica.label}: {exc}); retry",
            request_id=message.id,
        ) from None
    except DeadlineExceeded:
        raise UpstreamTimeout(
            f"Backend {replica.backend!r} did not answer within {timeout_s:g} s",
            request_id=message.id,
        ) from None
    except (ExchangeError, FrameTooLarge) as broken:
        raise BadGateway(
            f"Bad gateway: backend {replica.backend!r} ({replica.label}): {broken}",
            request_id=message.id,
        ) from None
    finally:
        if upstream is not None:
            upstream.close()


async def _final_event(upstream: UpstreamResponse, message: RPCRequest) -> bytes:
    """The answer to `message` in an event stream; what comes before it is dropped."""
    decoder = SSEDecoder()
    async for chunk in upstream.chunks():
        for frame in decoder.feed(chunk):
            if frame.data is None or '"method"' in frame.data:
                continue
            try:
                value = orjson.loads(frame.data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(value, dict) and value.get("id") == message.id:
                return frame.data.encode()
    raise ExchangeError("the event stream ended without an answer")


async def _deliver_answer(
    gateway: Gateway,
    front: FrontDoor,
    answer: RPCAnswer,
    session: LegacySession,
    principal: Principal,
) -> Reply:
    """The client's answer to a backend's request goes to the backend that asked, under the
    backend's own id, on whichever instance it was POSTed to: the id says which backend, the
    session's record which upstream session."""
    target = wire.denamespaced(answer.id)
    if target is None:
        log.debug("a client answered an id taskgate never sent; dropped")
        return _ACCEPTED
    name, upstream_id = target
    upstream = session.upstreams.get(name)
    backend = gateway.backends.get(name)
    if upstream is None or backend is None:
        return _ACCEPTED  # no upstream session of that backend asked it
    status = await front.upstreams.notify(
        upstream,
        own_headers(backend, principal),
        session.protocol_version,
        wire.answer_upstream(answer, upstream_id),
    )
    if status == 404:
        await front.upstreams.end(session, gateway.backends, lost=True)
        raise SessionNotFound(answer.id)
    return _ACCEPTED


async def _batch(
    gateway: Gateway,
    front: FrontDoor,
    request: DownstreamRequest,
    messages: list[LegacyMessage],
    principal: Principal,
    slot: int,
    seen: Exchange,
) -> Reply:
    """A 2025-03-26 batch: each message in order, the requests' answers in one JSON array
    (202 when it holds none). Later revisions removed batches; initialize may not be batched."""
    session = await front.sessions.find(
        request.headers.get(SESSION_HEADER), principal, None, fresh=True
    )
    if session.protocol_version != LEGACY_VERSIONS[0]:
        raise HTTPRefusal(
            f"Invalid request: batches exist only in MCP 2025-03-26; this session speaks "
            f"{session.protocol_version}",
            status=400,
        )
    answers: list[bytes] = []
    for message in messages:
        if isinstance(message, RPCRequest) and message.method == "initialize":
            raise HTTPRefusal("Invalid request: initialize may not be part of a batch", status=400)
        member = Exchange()
        try:
            reply = await _message(
                gateway, front, request, message, session, principal, slot, member, whole=True
            )
        except GatewayError as refused:
            if refused.request_id is None and not isinstance(message, RPCNotification | RPCAnswer):
                refused.request_id = message.id
            if isinstance(message, RPCRequest):
                answers.append(refused.body())
            continue
        if isinstance(reply, DownstreamResponse) and reply.body and isinstance(message, RPCRequest):
            answers.append(reply.body)
    if not answers:
        return _ACCEPTED
    return DownstreamResponse(body=b"[" + b",".join(answers) + b"]", content_type=JSON)


def _check_version(
    request: DownstreamRequest, session: LegacySession, request_id: RequestId | None
) -> None:
    """A version header other than the session's negotiated one is the revision's 400."""
    sent = request.headers.get(VERSION_HEADER)
    if sent is not None and sent != session.protocol_version:
        raise HTTPRefusal(
            f"Bad Request: MCP-Protocol-Version {sent!r} is not this session's "
            f"{session.protocol_version}",
            request_id=request_id,
            status=400,
        )


def refuse(request_id: RequestId | None) -> GatewayError:
    """A 2025-era request while legacy.enabled is off: 400 naming the revision served."""
    return HTTPRefusal(
        "Bad Request: this is a request of the 2025 MCP era (initialize, Mcp-Session-Id, a "
        "batch or a posted response); taskgate serves MCP 2026-07-28 here, where each request "
        "carries params._meta with 'io.modelcontextprotocol/protocolVersion' (start with "
        "server/discover)",
        request_id=request_id,
        status=400,
        data={"supported": ["2026-07-28"]},
    )


def _result(request_id: RequestId, result: dict[str, Any]) -> DownstreamResponse:
    return DownstreamResponse(body=wire.answer(request_id, result), content_type=JSON)
