"""Admission: the steps every request on the MCP path takes, whichever its era, run once here.

POST: Origin, token, Host, Content-Type and Accept, the body, the coordinator's slot (steps 1-4
of docs/architecture.md, "The path of a request"); then the request goes to the modern pipeline
(gateway/pipeline/modern.py) or to the 2025-era front door (gateway/pipeline/legacy.py), as
peers, by its era (gateway/protocol/era.py). GET and DELETE: Origin, token, Host; then a 2025-era
session's stream or end, or 405. Every request's record (the request log, the metrics, its
trace span) is kept here too.
"""

from __future__ import annotations

import logging

from gateway.auth import Principal
from gateway.errors import GatewayError, HTTPRefusal, LimitReached, Retryable, from_protocol
from gateway.h1.limits import Refused
from gateway.h1.request import DownstreamRequest, Reply
from gateway.listen.hub import Opened
from gateway.observe.exchange import Exchange
from gateway.observe.trace import trace_id
from gateway.pipeline import legacy, modern
from gateway.pipeline.replies import CLIENT_LEFT, STREAM_ENDED, failed
from gateway.pipeline.state import Gateway
from gateway.protocol.accept import acceptable
from gateway.protocol.codes import ProtocolError
from gateway.protocol.envelope import request_id_of
from gateway.protocol.era import SESSION_HEADER, LegacyAfterAll, is_modern, looks_legacy
from gateway.upstream.relay import JSON

log = logging.getLogger("taskgate.handler")

# A 2025-era session's stream and its end, served when legacy.enabled is on and the request
# names a session; without one they are 405, as on a 2026-07-28 endpoint (which is also what
# the 2025 revisions let a server without a GET stream answer).
_SESSION_METHODS = ("GET", "DELETE")
# A rest ends this much after the wait it was told: uvloop's timers count from the loop's clock
# as of the start of its iteration, so one may end a few ms early, and the request read then
# would be refused again for want of those ms.
_PAUSE_MARGIN_MS = 10
_NOT_ACCEPTABLE = (
    "Not acceptable: the Accept header must admit both application/json and text/event-stream"
)


async def handle_post(gateway: Gateway, request: DownstreamRequest) -> Reply:
    """A POST, then its record: counted, logged, kept when it failed."""
    exchange = Exchange()
    headers = request.headers
    tracer = gateway.observer.tracer
    if tracer is None:
        exchange.trace_id = trace_id(headers.get("traceparent"))
    else:  # the request's span, continuing the client's trace or starting one
        exchange.span = tracer.request(exchange, headers)
    try:
        reply = await _post(gateway, request, exchange)
    except BaseException as exc:  # cancelled: the client left before its answer
        if exchange.span is not None:
            exchange.span.abandon(exchange, exc)
            exchange.span = None  # ended
        if exchange.method == "subscriptions/listen" or exchange.answered:
            # a listen ends when its client leaves; so may a stream whose answer was sent
            gateway.observer.finish(exchange, STREAM_ENDED)
        else:
            exchange.message = "the client left before its answer"
            gateway.observer.finish(exchange, CLIENT_LEFT)
        raise
    gateway.observer.finish(exchange, reply)  # which ends the span, if any
    return reply


async def _post(gateway: Gateway, request: DownstreamRequest, seen: Exchange) -> Reply:
    try:
        # 1 Origin, then the token: one verified before is known without an await
        principal = _known(request, gateway, seen)
        if principal is None:
            principal = await _verified(request, gateway, seen)
        _admit(request, gateway)  # 2 admit: transport checks before the body
        body = request.arrived()  # 3 read the body (a small one came with its head)
        if body is None:
            body = await _read_body(request)
        # 4 the coordinator admits the request once it has arrived whole, or refuses it at once
        # (503, Retry-After): a client that trickles its body holds no slot while it does, and
        # no tenant holds more than its share (docs/decisions.md, 35).
        try:
            admitted = gateway.coordinator.request(principal.tenant, principal.subject)
        except GatewayError as refused:  # the body is not parsed yet: its id, for the answer
            refused.request_id = request_id_of(body)
            if isinstance(refused, LimitReached):  # limits.*.concurrent: counted with the rest
                gateway.limits.counted(principal.tenant, refused.limit)
            raise
        with admitted as slot:
            reply = await _by_era(gateway, request, body, principal, slot, seen)
        if isinstance(reply, Opened):
            # A listen stream lasts as long as its client: it holds no coordinator slot.
            return await gateway.listens.serve(request, reply)
        return reply
    except ProtocolError as refused:
        return failed(seen, from_protocol(refused))
    except GatewayError as exc:
        if exc.request_id is None:  # raised where the id is not known (discovery, the store)
            exc.request_id = seen.request_id
        if isinstance(exc, LimitReached):
            _pause(request, gateway, exc)
        return failed(seen, exc)
    except Exception:
        log.exception("unexpected failure while serving a request")
        return failed(seen, GatewayError("Internal error", request_id=seen.request_id))


async def _by_era(
    gateway: Gateway,
    request: DownstreamRequest,
    body: bytes,
    principal: Principal,
    slot: int,
    seen: Exchange,
) -> Reply | Opened:
    """The modern pipeline or the 2025-era front door, by the body (gateway/protocol/era.py);
    a 2025-era request while the front door is off is refused naming the revision served."""
    front = gateway.legacy
    if not is_modern(body) and looks_legacy(request.headers.get(SESSION_HEADER), body):
        if front is None:
            raise legacy.refuse(None)
        return await legacy.post(gateway, front, request, body, principal, slot, seen)
    try:
        return await modern.serve(request, body, gateway, principal, slot, seen)
    except LegacyAfterAll as found:
        if front is None:
            raise found.refused from None
        return await legacy.post(gateway, front, request, body, principal, slot, seen)


async def handle_other(gateway: Gateway, request: DownstreamRequest) -> Reply:
    """Any other method on the MCP path (GET, DELETE, ...), then its record."""
    exchange = Exchange()
    exchange.method = request.method  # llhttp's method names: a bounded label
    try:
        reply = await _other(gateway, request, exchange)
    except BaseException:  # cancelled: the client left; a GET stream ends that way
        gateway.observer.finish(exchange, STREAM_ENDED if request.method == "GET" else CLIENT_LEFT)
        raise
    gateway.observer.finish(exchange, reply)
    return reply


async def _other(gateway: Gateway, request: DownstreamRequest, seen: Exchange) -> Reply:
    """A 2025-era session's GET stream or DELETE; anything else 405. The caller is admitted
    first (Origin, token, Host), so that nothing answers an unauthenticated one but 401."""
    try:
        principal = _known(request, gateway, seen)
        if principal is None:
            principal = await _verified(request, gateway, seen)
        _check_host(request, gateway)
        front = gateway.legacy
        if (
            front is not None
            and request.method in _SESSION_METHODS
            and request.headers.get(SESSION_HEADER) is not None
        ):
            return await legacy.session_request(gateway, front, request, principal)
        raise HTTPRefusal(
            f"Method not allowed: {request.method}; MCP 2026-07-28 uses POST only",
            status=405,
            headers={"Allow": "POST"},
        )
    except GatewayError as exc:
        if isinstance(exc, LimitReached):
            _pause(request, gateway, exc)
        return failed(seen, exc)
    except Exception:
        log.exception("unexpected failure while serving a %s request", request.method)
        return failed(seen, GatewayError("Internal error"))


def _known(request: DownstreamRequest, gateway: Gateway, seen: Exchange) -> Principal | None:
    """Step 1: a caller without a valid token learns nothing but 401, except that a present,
    disallowed Origin is 403 whatever the token (the core's MUST, basic/transports/
    streamable-http, Security; docs/decisions.md, 14). Here the Origin, and the caller when
    its token was verified before (no coroutine for the common case); None: _verified."""
    if not gateway.guard.origin_allowed(request.headers.get("Origin")):
        raise HTTPRefusal("Forbidden: this Origin may not call taskgate", status=403)
    # The connection's last token, sent again: known by its bytes, without hashing them.
    single = _token_bytes(request)
    principal = None if single is None else gateway.auth.recall(single, request.remembered())
    if principal is None:
        principal = gateway.auth.known(request.headers.getall("Authorization"))
        if principal is not None:
            _remember_token(request, gateway)
    if principal is not None:
        seen.tenant = principal.tenant
    return principal


async def _verified(request: DownstreamRequest, gateway: Gateway, seen: Exchange) -> Principal:
    """The rest of step 1: the token verified (its keys perhaps fetched), or 401."""
    principal = await gateway.auth.authenticate(request.headers.getall("Authorization"))
    _remember_token(request, gateway)
    seen.tenant = principal.tenant
    return principal


def _token_bytes(request: DownstreamRequest) -> bytes | None:
    """The request's one Authorization value as received; None when it has none or several."""
    raw = request.header_bytes(b"authorization")
    return raw[0] if raw is not None and len(raw) == 1 else None


def _remember_token(request: DownstreamRequest, gateway: Gateway) -> None:
    """A token just known or verified, kept for the connection's next requests; not on one
    that closes after this answer, where making the memo would only hash the token again."""
    single = _token_bytes(request)
    if single is not None and request.keep_alive:
        request.remember(gateway.auth.memo(single))


def _pause(request: DownstreamRequest, gateway: Gateway, refused: LimitReached) -> None:
    """limits.pause_refused_ms: the connection of a caller refused for a limit is not read for
    the wait it was told, at most that long (docs/limits.md, "Pausing the refused")."""
    most_ms = gateway.limits.policy.config.pause_refused_ms
    if most_ms:
        request.pause_s = min(refused.retry_after_ms + _PAUSE_MARGIN_MS, most_ms) / 1000


def _check_host(request: DownstreamRequest, gateway: Gateway) -> None:
    if not gateway.guard.host_allowed(request.headers.get("Host")):
        raise HTTPRefusal("Forbidden: this Host name is not served here", status=403)


def _admit(request: DownstreamRequest, gateway: Gateway) -> None:
    """Transport checks that come before the body: Host, Content-Type, Accept. The last two
    refuse what a backend would refuse before reading a body (FastMCP: 400 for the
    Content-Type, a bare 406 for Accept), so that it is refused here, in JSON-RPC, with no
    replica involved. A request without Accept passes: taskgate sends one upstream."""
    _check_host(request, gateway)
    if request.content_type != JSON:
        raise HTTPRefusal("Unsupported media type: the body must be application/json", status=415)
    accept = request.headers.getall("Accept")
    if accept and not acceptable(accept):
        raise HTTPRefusal(_NOT_ACCEPTABLE, status=406)


async def _read_body(request: DownstreamRequest) -> bytes:
    """The body, read whole: the server bounds its size (413, at once when Content-Length
    says so) and the time it may take (408). No coordinator slot is held meanwhile."""
    try:
        return await request.read()
    except Refused as exc:
        if exc.status == 503:  # taskgate holds as many request bytes as it may, for now
            raise Retryable(exc.reason) from None
        raise HTTPRefusal(exc.reason, status=exc.status) from None
