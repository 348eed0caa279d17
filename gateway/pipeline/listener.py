"""The public listener: taskgate's HTTP/1.1 server (gateway.h1.server), one dispatch on path and
method.

Every request on the MCP path goes to the admission (gateway/pipeline/admission.py): a POST on
to the pipeline of its era, a GET or DELETE to a 2025-era session, else 405; the RFC 9728
documents are served at their well-known paths; anything else is a JSON 404. The server's own
refusals (a head it cannot parse, a header over the limit, a request that never ends) carry a
JSON-RPC error body like every other answer.
"""

from __future__ import annotations

import orjson

from gateway.auth import metadata
from gateway.config import Config
from gateway.errors import error_body
from gateway.h1.limits import Limits
from gateway.h1.request import DownstreamRequest, DownstreamResponse, Handler, Reply
from gateway.h1.server import Server
from gateway.observe.exchange import Exchange
from gateway.pipeline.admission import handle_other, handle_post
from gateway.pipeline.state import Gateway
from gateway.protocol.codes import Code

JSON = "application/json"


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
    """The MCP path to the admission; RFC 9728 metadata at its well-known paths; anything
    else 404."""
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
        if request.path == path:  # the admission records its own exchange
            if request.method == "POST":
                return await handle_post(gateway, request)
            return await handle_other(gateway, request)
        exchange = Exchange()
        exchange.method = request.method  # llhttp's method names: a bounded label
        reply: DownstreamResponse
        if (document := documents.get(request.path)) is not None and request.method in (
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
