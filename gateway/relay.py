"""Steps 5-7: call one upstream replica and relay its answer, JSON as bytes and SSE as it comes."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from gateway.errors import (
    BadGateway,
    GatewayError,
    UpstreamTimeout,
    UpstreamUnavailable,
    UpstreamUnreachable,
)
from gateway.protocol import headers as mcp
from gateway.protocol.envelope import Request
from gateway.protocol.sse import FrameTooLarge, SSEDecoder, encode_event
from gateway.routing.replicas import Replica

# Awaited with each JSON-RPC message of an answer before it is relayed; may raise GatewayError.
Inspector = Callable[[Any], Awaitable[None]]

log = logging.getLogger("taskgate.relay")

# Downstream headers that go upstream; everything else (Authorization, Cookie, hop-by-hop,
# Mcp-Session-Id, Last-Event-ID) stays behind. Mcp-Param-* pass, known or not (SPEC 2.4).
_FORWARDED = frozenset(
    {
        "content-type",
        "accept",
        mcp.PROTOCOL_VERSION,
        mcp.METHOD,
        mcp.NAME,
        "traceparent",
        "tracestate",
        "baggage",
        "user-agent",
    }
)
# Connecting is quick or it is not happening; a slow connect must not eat a call's deadline.
CONNECT_TIMEOUT_S = 3.0
_DEFAULT_ACCEPT = "application/json, text/event-stream"
JSON = "application/json"
EVENT_STREAM = "text/event-stream"
SSE_HEADERS = {"Content-Type": EVENT_STREAM, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Upstream answers relayed back besides the body: only what a client can act on.
_RELAYED_BACK = ("Retry-After",)


def upstream_headers(
    downstream: Iterable[tuple[str, str]], *, name: str | None, extra: dict[str, str]
) -> CIMultiDict[str]:
    """The headers of the upstream request, from the downstream one, the validated name and
    taskgate's own `extra` ones (its credential, the verified identity).

    Mcp-Name is set from the body (already checked against any header the client sent), so a
    backend that requires it is served even when the client omitted it.
    """
    out: CIMultiDict[str] = CIMultiDict()
    for key, value in downstream:
        lowered = key.lower()
        if lowered in _FORWARDED or lowered.startswith(mcp.PARAM_PREFIX):
            out.add(key, value)
    if name is not None:
        out[mcp.NAME] = mcp.encode_value(name)
    for key, value in extra.items():
        out[key] = value  # replaces any copy a client could have smuggled in
    out.setdefault("Accept", _DEFAULT_ACCEPT)
    out.setdefault("Content-Type", JSON)
    return out


async def forward(
    session: aiohttp.ClientSession,
    replica: Replica,
    request: Request,
    headers: CIMultiDict[str],
    timeout_s: float,
    downstream: web.Request,
    *,
    inspect: Inspector | None = None,
    idempotent: bool = False,
) -> web.StreamResponse:
    """POST `request` to `replica` and relay the answer; the upstream call dies with the client.

    `inspect` sees every JSON-RPC message of the answer before it is relayed and may refuse it
    by raising GatewayError (a task whose route could not be recorded). An `idempotent` call
    that times out is safe to retry, so it gets the retryable error rather than a 504.
    """
    timeout = _client_timeout(timeout_s)
    try:
        upstream = await session.post(
            replica.url, data=request.body, headers=headers, timeout=timeout, allow_redirects=False
        )
    except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
        raise UpstreamUnreachable(
            f"Backend {replica.backend!r} is unreachable ({replica.label}); retry",
            request_id=request.id,
        ) from None
    except TimeoutError:
        raise _timeout(replica, request, timeout_s, idempotent) from None
    except aiohttp.ClientError as exc:
        raise _bad_gateway(
            replica, request, f"the connection failed ({type(exc).__name__})"
        ) from None
    try:
        content_type = upstream.headers.get("Content-Type", "").partition(";")[0].strip().lower()
        if content_type == EVENT_STREAM:
            return await _relay_sse(upstream, downstream, replica, request, inspect)
        if content_type != JSON and not (upstream.status == 202 and not content_type):
            raise _unexpected(upstream, replica, request, content_type)
        body = await upstream.read()
        upstream.release()
        if inspect is not None and body:
            await inspect(_loads(body))
        response = web.Response(status=upstream.status, body=body)
        if body:
            response.content_type = JSON
        _copy_back(upstream, response)
        return response
    except TimeoutError:
        raise _timeout(replica, request, timeout_s, idempotent) from None
    except aiohttp.ClientError as exc:
        raise _bad_gateway(
            replica, request, f"the answer broke off ({type(exc).__name__})"
        ) from None
    finally:
        # Not released above means an error or a cancellation (the client went away): close
        # the connection rather than pool it, so the backend sees the disconnect and stops.
        if not upstream.closed:
            upstream.close()


async def _relay_sse(
    upstream: aiohttp.ClientResponse,
    downstream: web.Request,
    replica: Replica,
    request: Request,
    inspect: Inspector | None,
) -> web.StreamResponse:
    response = web.StreamResponse(status=upstream.status, headers=SSE_HEADERS)
    _copy_back(upstream, response)
    await response.prepare(downstream)
    decoder = SSEDecoder() if inspect is not None else None
    try:
        async for chunk in upstream.content.iter_any():
            if decoder is None or inspect is None:
                await response.write(chunk)
                continue
            for frame in decoder.feed(chunk):
                if frame.data is not None:
                    await inspect(_loads(frame.data.encode()))
                await response.write(frame.raw)
        if decoder is not None:
            await response.write(decoder.pending())
    except GatewayError as exc:
        # The status line is gone: the refusal travels as the response event of the stream.
        await response.write(encode_event(exc.body().decode(), event="message"))
    except (TimeoutError, aiohttp.ClientError, FrameTooLarge) as exc:
        # Nothing sensible can follow a broken stream; ending it abruptly tells the client.
        log.warning("upstream SSE from %s broke off: %s", replica.label, type(exc).__name__)
        if downstream.transport is not None:
            downstream.transport.close()
        return response
    except ConnectionResetError:
        return response  # the client left; the finally of forward() closes upstream
    await response.write_eof()
    return response


def _loads(data: bytes) -> Any:
    """A message for inspection; bytes that are not JSON are relayed uninspected."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _timeout(
    replica: Replica, request: Request, timeout_s: float, idempotent: bool
) -> GatewayError:
    message = f"Backend {replica.backend!r} did not answer within {timeout_s:g} s"
    if idempotent:
        return UpstreamUnavailable(f"{message}; retry", request_id=request.id)
    return UpstreamTimeout(message, request_id=request.id)


@functools.lru_cache(maxsize=64)
def _client_timeout(timeout_s: float) -> aiohttp.ClientTimeout:
    """One ClientTimeout per distinct deadline (there are a few per backend), not per call."""
    return aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(CONNECT_TIMEOUT_S, timeout_s))


def _copy_back(upstream: aiohttp.ClientResponse, response: web.StreamResponse) -> None:
    for key in _RELAYED_BACK:
        value = upstream.headers.get(key)
        if value is not None:
            response.headers[key] = value


def _unexpected(
    upstream: aiohttp.ClientResponse, replica: Replica, request: Request, content_type: str
) -> GatewayError:
    what = f"HTTP {upstream.status} with {content_type or 'no content type'}"
    if upstream.status in (502, 503, 504):
        return UpstreamUnavailable(
            f"Backend {replica.backend!r} is unavailable ({what}); retry", request_id=request.id
        )
    return _bad_gateway(replica, request, f"it answered {what}, not JSON-RPC")


def _bad_gateway(replica: Replica, request: Request, why: str) -> GatewayError:
    return BadGateway(
        f"Bad gateway: backend {replica.backend!r} ({replica.label}): {why}",
        request_id=request.id,
    )
