"""The answers every stage of the pipeline builds the same way: an error as JSON-RPC, a
result, and what the request log records of a request whose answer was never sent."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import GatewayError, LimitReached
from gateway.h1.request import DownstreamResponse
from gateway.observe.exchange import Exchange
from gateway.protocol.envelope import RPCRequest
from gateway.upstream.relay import JSON

# What the request log and the metrics say of a request whose client left before its answer
# (never sent): nginx's 499, "client closed request".
CLIENT_LEFT = DownstreamResponse(status=499, body=b"", content_type="")
STREAM_ENDED = DownstreamResponse(status=200, body=b"", content_type="")
# A notification or a client's answer, taken: nothing to say back.
ACCEPTED = DownstreamResponse(status=202)


def result(message: RPCRequest, value: dict[str, Any]) -> DownstreamResponse:
    body = orjson.dumps({"jsonrpc": "2.0", "id": message.id, "result": value})
    return DownstreamResponse(body=body, content_type=JSON)


def failed(seen: Exchange, exc: GatewayError) -> DownstreamResponse:
    """`exc` as the answer, and in the request's record (its code and message)."""
    seen.code = exc.code
    seen.message = exc.message
    if isinstance(exc, LimitReached):
        seen.limit = exc.limit
    return error(exc)


def error(exc: GatewayError) -> DownstreamResponse:
    return DownstreamResponse(
        status=exc.status, body=exc.body(), content_type=JSON, headers=exc.headers
    )
