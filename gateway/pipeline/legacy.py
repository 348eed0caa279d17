"""POST, GET and DELETE of 2025-era clients: the handshake and lists answered by taskgate, calls
relayed on upstream sessions, the client's answers and notifications delivered to the backends
they concern, the session ended with DELETE.

Origin, token, Host, Content-Type and Accept are checked before this module runs, in
gateway/pipeline/admission.py, exactly as for modern traffic; so are the coordinator's limits.
"""

from __future__ import annotations

import logging

from gateway.auth import Principal
from gateway.catalog.capabilities import advertises
from gateway.catalog.discovery import SERVER_INFO
from gateway.errors import (
    BadCursor,
    GatewayError,
    HTTPRefusal,
    InBandError,
)
from gateway.h1.request import DownstreamRequest, DownstreamResponse, Reply
from gateway.legacy import wire
from gateway.legacy.door import FrontDoor
from gateway.legacy.wire import LegacyMessage, RPCAnswer
from gateway.observe.exchange import Exchange
from gateway.pipeline.legacy_calls import deliver_answer, relayed_request
from gateway.pipeline.legacy_tasks import LEGACY_TASK_METHODS, offers_tasks, task_method
from gateway.pipeline.replies import ACCEPTED, result
from gateway.pipeline.state import Gateway
from gateway.protocol.codes import Code, RequestId
from gateway.protocol.envelope import RPCNotification, RPCRequest
from gateway.protocol.era import LEGACY_VERSIONS, SESSION_HEADER, VERSION_HEADER
from gateway.store.sessions import LegacySession
from gateway.upstream.relay import JSON

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
_RELAYED = frozenset(
    {
        "tools/call",
        "prompts/get",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "completion/complete",
    }
)
_GATED = {
    "prompts/list": "prompts",
    "prompts/get": "prompts",
    "resources/list": "resources",
    "resources/templates/list": "resources",
    "resources/read": "resources",
    "resources/subscribe": "resources",
    "resources/unsubscribe": "resources",
    "completion/complete": "completions",
}
# What a 2025-era client asks that taskgate does not carry, with the reason the error names.
_NOT_SERVED = {method: "no routed backend runs 2025-11-25 tasks" for method in LEGACY_TASK_METHODS}


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
        if gateway.limits.policy.any:
            await gateway.limits.admit(principal, False, parsed.id)
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


async def session_request(
    gateway: Gateway, front: FrontDoor, request: DownstreamRequest, principal: Principal
) -> Reply:
    """GET (the session's stream) or DELETE (its end) of an admitted caller's session."""
    if gateway.limits.policy.any:
        await gateway.limits.admit(principal, False, None)
    header = request.headers.get(SESSION_HEADER)
    session = await front.sessions.find(header, principal, None, fresh=True)
    if request.method == "DELETE":
        await front.upstreams.end(session, gateway.backends)
        return DownstreamResponse(status=200)
    accept = request.headers.getall("Accept")
    if not any("text/event-stream" in value or "*/*" in value for value in accept):
        raise HTTPRefusal(
            "Not acceptable: the GET stream is text/event-stream; the Accept header must admit it",
            status=406,
        )
    last_event_id = request.headers.get("Last-Event-ID")
    if last_event_id:  # a stream the client lost, resumed where a backend kept its events
        resumed = await front.streams.resume(
            request, session, principal, gateway.backends, last_event_id
        )
        if resumed is not None:
            return resumed
    return await front.streams.serve(
        request,
        session,
        principal,
        front.sessions,
        gateway.backends,
        gateway.listens.lists,
        gateway.config.subscriptions.keepalive_s,
    )


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
        return await deliver_answer(gateway, front, message, session, principal)
    if isinstance(message, RPCNotification):
        seen.method = "notification"
        if message.method != "notifications/initialized":  # taskgate sent its own upstream
            await front.upstreams.fan_out(session, gateway.backends, principal, message.body)
        return ACCEPTED
    seen.request_id = message.id
    method = message.method
    seen.method = method if method in _LABELS else "other"
    limits = gateway.limits
    if limits.policy.any:  # as a 2026-07-28 request (gateway/pipeline/modern.py)
        calls = method == "tools/call"
        creates = calls and isinstance(message.params.get("task"), dict)
        tool = message.params.get("name") if calls else None
        await limits.admit(principal, creates, message.id, tool if isinstance(tool, str) else None)
    if method in LEGACY_TASK_METHODS and offers_tasks(gateway):
        return await task_method(gateway, request, message, session, principal, seen)
    if method in _NOT_SERVED or method == "initialize":
        why = _NOT_SERVED.get(method, "the session is initialized already")
        raise InBandError(
            f"Method not found: {method} ({why})",
            request_id=message.id,
            code=Code.METHOD_NOT_FOUND,
        )
    if method == "ping":
        return result(message, {})
    if method == "logging/setLevel":
        return await _set_level(gateway, front, message, session, principal)
    capability = _GATED.get(method)
    if capability is not None and not await gateway.catalog.serves(capability):  # type: ignore[arg-type]
        raise InBandError(
            f"Method not found: {method} (no routed backend serves {capability})",
            request_id=message.id,
            code=Code.METHOD_NOT_FOUND,
        )
    listed = await _listed(gateway, message, principal.tenant)
    if listed is not None:
        return listed
    return await relayed_request(
        gateway, front, request, message, session, principal, slot, seen, whole
    )


async def _set_level(
    gateway: Gateway,
    front: FrontDoor,
    message: RPCRequest,
    session: LegacySession,
    principal: Principal,
) -> Reply:
    """logging/setLevel: kept with the client's session, sent to each of its upstream sessions,
    and to those opened after it as they open (the client's log messages come on them)."""
    level = message.params.get("level")
    if level not in wire.LOG_LEVELS:
        raise InBandError(
            f"Invalid params: level must be one of {', '.join(wire.LOG_LEVELS)}",
            request_id=message.id,
            code=Code.INVALID_PARAMS,
        )
    if not await _serves_logging(gateway):
        raise InBandError(
            "Method not found: logging/setLevel (no routed backend serves logging)",
            request_id=message.id,
            code=Code.METHOD_NOT_FOUND,
        )
    assert isinstance(level, str)
    session = await front.sessions.set_log_level(session, level, message.id)
    await front.upstreams.set_level(session, gateway.backends, principal, level)
    return result(message, {})


async def _serves_logging(gateway: Gateway) -> bool:
    """Whether a backend says it sends log messages (its discover, or a 2025-era server's
    initialize as the catalogue keeps it)."""
    views = await gateway.catalog.views()
    return any(advertises(view.discover, "logging") for view in views.values())


def _subscribes(gateway: Gateway) -> bool:
    """Whether a backend that a route names resources on is a 2025-era server that said it
    takes resources/subscribe (a modern one's updates come through listens, not sessions)."""
    eras = gateway.catalog.eras
    routed = {r.backend for r in gateway.routes.routes if r.resources or r.resource_templates}
    for name in routed & gateway.backends.keys():
        resources = eras.capabilities(gateway.backends[name]).get("resources")
        if isinstance(resources, dict) and resources.get("subscribe") is True:
            return True
    return False


async def _listed(gateway: Gateway, message: RPCRequest, tenant: str) -> DownstreamResponse | None:
    """A list taskgate answers from its catalogue, in the 2025 shape; None for other methods."""
    catalog = gateway.catalog
    method = message.method
    if method == "tools/list":
        if message.params.get("cursor") is not None:
            raise BadCursor(request_id=message.id)  # one page, so no cursor is taskgate's
        return result(message, wire.legacy_result(await catalog.tools_result(tenant)))
    cursor = message.params.get("cursor")
    if method == "prompts/list":
        return result(message, wire.legacy_result(await catalog.prompts_result(tenant, cursor)))
    if method == "resources/list":
        listed = await catalog.resources_result(tenant, cursor)
        return result(message, wire.legacy_result(listed))
    if method == "resources/templates/list":
        listed = await catalog.templates_result(tenant, cursor)
        return result(message, wire.legacy_result(listed))
    return None


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
    logging = await _serves_logging(gateway)
    initialized = wire.initialize_result(
        version,
        discovered["capabilities"],
        SERVER_INFO,
        logging=logging,
        subscribe=_subscribes(gateway),
        tasks=offers_tasks(gateway),
    )
    return DownstreamResponse(
        body=wire.answer(message.id, initialized),
        content_type=JSON,
        headers={SESSION_HEADER: session.session_id},
    )


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
        return ACCEPTED
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
