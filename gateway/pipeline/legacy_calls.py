"""The 2025-era front door's relayed calls: a routed request on the upstream session of the
caller's session with the backend (opened on first use), through the one upstream attempt
(gateway/upstream/attempt.py); and the client's answers to a backend's requests, delivered to
the backend that asked."""

from __future__ import annotations

import logging

from gateway.auth import Principal
from gateway.catalog.table import Route
from gateway.errors import (
    InBandError,
    Retryable,
    SessionNotFound,
    UpstreamUnreachable,
)
from gateway.h1.request import DownstreamRequest, DownstreamResponse, Reply
from gateway.legacy import wire
from gateway.legacy.door import FrontDoor
from gateway.legacy.upstreams import own_headers, session_headers
from gateway.legacy.wire import (
    RPCAnswer,
)
from gateway.observe.exchange import Exchange
from gateway.pipeline.legacy_tasks import as_task
from gateway.pipeline.replies import ACCEPTED
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
from gateway.protocol.codes import Code
from gateway.protocol.envelope import RPCRequest
from gateway.store.sessions import LegacySession, UpstreamSession
from gateway.upstream.attempt import first_reachable
from gateway.upstream.relay import forward, forward_whole, upstream_headers
from gateway.upstream.replicas import Backend, Replica

log = logging.getLogger("taskgate.legacy")


async def relayed_request(
    gateway: Gateway,
    front: FrontDoor,
    request: DownstreamRequest,
    message: RPCRequest,
    session: LegacySession,
    principal: Principal,
    slot: int,
    seen: Exchange,
    whole: bool,
) -> Reply:
    """The methods relayed on an upstream session, routed as 2026-07-28 requests are."""
    method = message.method
    route: Route
    if method == "tools/call":
        tool = required_name(message.params.get("name"), message)
        route = await tool_route(gateway, tool, principal, message.id)
        return await _relayed(
            gateway, front, request, message, session, principal, slot, route, "tool", seen, whole
        )
    if method == "prompts/get":
        name = required_name(message.params.get("name"), message)
        route = await prompt_route(gateway, name, principal, message.id)
        reply = await _relayed(
            gateway, front, request, message, session, principal, slot, route, "prompt", seen, whole
        )
        return normalised_unknown_prompt(reply, message, name)
    if method in ("resources/read", "resources/subscribe", "resources/unsubscribe"):
        # To the backend that serves the URI; a subscription's resources/updated come on that
        # upstream session's GET stream, which the client's GET stream relays.
        uri = required_name(message.params.get("uri"), message, "uri")
        route = await uri_route(gateway, uri, principal, message.id)
        reply = await _relayed(
            gateway, front, request, message, session, principal, slot, route, "resource", seen,
            whole,
        )  # fmt: skip
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
    replica, upstream = await _bound(gateway, front, session, backend, principal, message)
    gateway.coordinator.route(slot, backend.name, message.id)
    extra = {
        **own_headers(backend, principal),
        **session_headers(upstream, session.protocol_version),
    }
    headers = upstream_headers(request.raw_headers, name=None, extra=extra)
    rewrite = None if whole else wire.relay_rewriter(backend.name, seen)
    message, inspect = as_task(
        gateway, backend, replica, upstream, session, principal, message, extra, rewrite is None
    )

    async def attempt(on: Replica, _: dict[str, str] | None) -> Reply:
        if rewrite is None:
            return await forward_whole(gateway.pool, on, message, headers, backend.timeout_s)
        timeout_s = backend.timeout_s
        return await forward(
            gateway.pool, on, message, headers, timeout_s, request, inspect=inspect, rewrite=rewrite
        )

    try:
        reply = await first_reachable(gateway.health, [replica], attempt, seen)
    except UpstreamUnreachable:
        # The replica holding the upstream session is gone, and the session with it: the
        # client's session cannot go on (the revision's 404; the client initializes again).
        await front.upstreams.end(session, gateway.backends, lost=True)
        raise SessionNotFound(message.id) from None
    if reply.status == 404 and isinstance(reply, DownstreamResponse):
        # The backend no longer knows the upstream session (it restarted, or ended it).
        log.info(
            "%s of %s lost a 2025-era session; the client's session ends",
            replica.label,
            backend.name,
        )
        await front.upstreams.end(session, gateway.backends, lost=True)
        raise SessionNotFound(message.id)
    return reply


async def _bound(
    gateway: Gateway,
    front: FrontDoor,
    session: LegacySession,
    backend: Backend,
    principal: Principal,
    message: RPCRequest,
) -> tuple[Replica, UpstreamSession]:
    """The replica and upstream session of `backend` that this client session uses, opened now
    on a healthy replica when it is the first; SessionNotFound once the client's session ended."""
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
    return replica, upstream


async def deliver_answer(
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
        return ACCEPTED
    name, upstream_id = target
    upstream = session.upstreams.get(name)
    backend = gateway.backends.get(name)
    if upstream is None or backend is None:
        return ACCEPTED  # no upstream session of that backend asked it
    status = await front.upstreams.notify(
        upstream,
        own_headers(backend, principal),
        session.protocol_version,
        wire.answer_upstream(answer, upstream_id),
    )
    if status == 404:
        await front.upstreams.end(session, gateway.backends, lost=True)
        raise SessionNotFound(answer.id)
    return ACCEPTED
