"""The public listener: taskgate's HTTP/1.1 server (gateway.h1.server), one dispatch on path and
method.

POST on the MCP path runs the pipeline; any other method there is 405 after auth; the RFC 9728
documents are served at their well-known paths; anything else is a JSON 404. The server's own
refusals (a head it cannot parse, a header over the limit, a request that never ends) carry a
JSON-RPC error body like every other answer.
"""

from __future__ import annotations

import orjson

from gateway.auth import metadata
from gateway.config import Config
from gateway.errors import error_body
from gateway.h1.server import DownstreamRequest, DownstreamResponse, Handler, Limits, Reply, Server
from gateway.legacy.wire import SESSION_HEADER
from gateway.observe.exchange import Exchange
from gateway.pipeline.modern import handle_post, handle_session_request, method_not_allowed
from gateway.pipeline.state import Gateway
from gateway.protocol.codes import Code

JSON = "application/json"
# A 2025-era session's stream and its end, served when legacy.enabled is on and the request
# names a session; without one they are 405, as on a 2026-07-28 endpoint (which is also what
# the 2025 revisions let a server without a GET stream answer).
_SESSION_METHODS = ("GET", "DELETE")


def public_server(config: Config, gateway: Gateway) -> Server:
    """The server of `config.listen`, with its header, body and time limits. A handler is
    cancelled when its client disconnects, which closes its upstream request."""
    listen = config.listen
    limits = Limits(
        max_header_bytes=listen.max_header_bytes,
        max_headers=listen.max_headers,
        max_head_bytes=listen.max_head_bytes,
        max_body_bytes=listen.max_body_bytes,
        read_timeout_s=listen.read_timeout_s,
        keepalive_timeout_s=listen.keepalive_timeout_s,
        max_connections=listen.max_connections,
        max_buffered_bytes=listen.max_buffered_bytes,
        max_requests_per_connection=listen.max_requests_per_connection,
    )
    observer = gateway.observer

    def refused(status: int, reason: str) -> DownstreamResponse:
        # The server's own refusals (a head it cannot parse, a body too large or too slow) are
        # requests too: counted and logged like every other.
        response = refusal(status, reason)
        exchange = Exchange()
        exchange.message = reason
        observer.finish(exchange, response)
        return response

    # The relay's budget of answer bytes also counts the server's own answers (refusals, lists
    # answered from the catalogue) from a connection's first byte on (gateway/h1/answers.py).
    return Server(dispatcher(config, gateway), limits, refused, answers=gateway.pool.answers)


def dispatcher(config: Config, gateway: Gateway) -> Handler:
    """POST on the MCP path is the pipeline; any other method there is 405 (after auth);
    RFC 9728 metadata at its well-known paths; anything else 404."""
    path = config.listen.path
    documents: dict[str, bytes] = {}
    if config.auth.mode == "jwt":
        # RFC 9728: the root document and the one for the MCP path, public like the key set.
        document = orjson.dumps(metadata.document(config.auth))
        for well_known in (metadata.WELL_KNOWN, metadata.WELL_KNOWN + path.rstrip("/")):
            documents[well_known] = document
    not_found = error_body(None, Code.INVALID_REQUEST, f"Not found: taskgate serves MCP at {path}")

    observer = gateway.observer

    async def dispatch(request: DownstreamRequest) -> Reply:
        if request.path == path and request.method == "POST":
            return await handle_post(gateway, request)  # which records its own exchange
        exchange = Exchange()
        exchange.method = request.method  # llhttp's method names: a bounded label
        reply: DownstreamResponse
        if request.path == path:
            if (
                gateway.legacy is not None
                and request.method in _SESSION_METHODS
                and request.headers.get(SESSION_HEADER) is not None
            ):
                return await handle_session_request(gateway, request)  # records its own
            reply = await method_not_allowed(gateway, request)
        elif (document := documents.get(request.path)) is not None and request.method in (
            "GET",
            "HEAD",
        ):
            reply = DownstreamResponse(body=document, content_type=JSON)
        else:
            reply = DownstreamResponse(status=404, body=not_found, content_type=JSON)
        observer.finish(exchange, reply)
        return reply

    return dispatch


def refusal(status: int, reason: str) -> DownstreamResponse:
    """The server's own refusals, as JSON-RPC errors without an id (the body was not read); a
    503 is the retryable error, as every other 503 of taskgate's."""
    if status == 503:
        body = error_body(None, Code.INTERNAL_ERROR, reason, {"retryable": True})
        return DownstreamResponse(status, body, JSON, {"Retry-After": "1"})
    code = Code.INTERNAL_ERROR if status >= 500 else Code.INVALID_REQUEST
    return DownstreamResponse(status=status, body=error_body(None, code, reason), content_type=JSON)
