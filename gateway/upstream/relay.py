"""Call one upstream replica and relay its answer, JSON as bytes and SSE as it comes.

Steps 8-10 of a request, in docs/architecture.md; capture (9) is the Inspector a caller passes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson

from gateway.errors import GatewayError, UnsafeHeader
from gateway.h1.answers import AnswerAccount
from gateway.h1.request import DownstreamRequest, DownstreamResponse, Reply, Stream
from gateway.protocol import headers as mcp
from gateway.protocol.codes import RequestId
from gateway.protocol.envelope import RPCRequest
from gateway.protocol.sse import AnswerReader, FrameTooLarge, SSEDecoder, encode_event
from gateway.upstream.connection import UpstreamResponse
from gateway.upstream.failures import bad_gateway, failure, unexpected
from gateway.upstream.framing import ConnectFailed, ExchangeError, header_value
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Replica

# Awaited with each JSON-RPC message of an answer before it is relayed; may raise GatewayError.
Inspector = Callable[[Any], Awaitable[None]]
# Each message of an answer as the client gets it (the front door namespaces a backend's
# requests; gateway/bridge gives 2026-07-28 shapes): its argument relays the bytes as they
# came; None leaves an event of a stream out (a JSON answer is relayed as it came then).
Rewriter = Callable[[bytes], bytes | None]

log = logging.getLogger("taskgate.relay")

# Downstream headers that go upstream; everything else (Authorization, Cookie, hop-by-hop,
# Mcp-Session-Id, Last-Event-ID) stays behind. Mcp-Param-* pass, known or not: an intermediary
# MUST forward them (the core, basic/transports/streamable-http; docs/architecture.md, Sources).
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
_DEFAULT_ACCEPT = "application/json, text/event-stream"
JSON = "application/json"
EVENT_STREAM = "text/event-stream"
SSE_HEADERS = {"Content-Type": EVENT_STREAM, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Upstream answers relayed back besides the body: only what a client can act on.
_RELAYED_BACK = ("Retry-After",)
# One event of an answer read whole (its answer event, and each one before it).
MAX_EVENT_BYTES = 4 * 1024 * 1024


def upstream_headers(
    downstream: Iterable[tuple[bytes, bytes]], *, name: str | None, extra: dict[str, str]
) -> bytes:
    """The header lines of the upstream request (CRLF-terminated; the pool adds Host and
    Content-Length), from the downstream ones as received (aiohttp's raw headers), the
    validated name and taskgate's own `extra` ones (its credential, the verified identity).

    Mcp-Name is set from the body (already checked against any header the client sent), so a
    backend that requires it is served even when the client omitted it. A client's copy of an
    `extra` header never passes: taskgate's own replaces it. Forwarded headers keep their exact
    bytes; nothing is decoded and encoded again, except that several Accept lines go as one,
    joined as RFC 9110 5.3 combines them: taskgate admitted them together, and a backend may
    read only the first (the MCP SDK does).
    """
    own = {key.lower() for key in extra}
    if name is not None:
        own.add(mcp.NAME)
    parts: list[bytes] = []
    accept = -1  # where the value of the client's Accept line is in `parts`
    content_type = False
    for key, value in downstream:
        lowered = _forwarded.get(key)
        if lowered is None:
            lowered = _decide(key)
        if not lowered or lowered in own:
            continue
        if lowered == "accept":
            if accept >= 0:
                parts[accept] += b", " + value
                continue
            accept = len(parts) + 2
        elif lowered == "content-type":
            content_type = True
        parts += (key, b": ", value, b"\r\n")
    if name is not None:
        parts.append(f"Mcp-Name: {mcp.encode_value(name)}\r\n".encode("ascii"))
    if extra:
        parts.append(header_lines(extra))
    if accept < 0:
        parts.append(_DEFAULT_ACCEPT_LINE)
    if not content_type:
        parts.append(_DEFAULT_CONTENT_TYPE_LINE)
    return b"".join(parts)


def header_lines(headers: dict[str, str]) -> bytes:
    """taskgate's own headers (its credential, the verified identity) as CRLF-terminated
    lines; UnsafeHeader when a value could split the request."""
    lines = []
    for key, value in headers.items():
        if "\r" in value or "\n" in value or "\0" in value:
            raise UnsafeHeader(
                "Invalid request: the token's identity cannot be sent upstream "
                "(a claim contains a line break or NUL)"
            )
        lines.append(f"{key}: {value}\r\n")
    return "".join(lines).encode()


# Raw header name -> its lower-case form if it goes upstream, else "". Names repeat from
# request to request, so each is decided once; the bound keeps odd clients from growing it.
_forwarded: dict[bytes, str] = {}
_FORWARDED_MEMO = 512
_DEFAULT_ACCEPT_LINE = f"Accept: {_DEFAULT_ACCEPT}\r\n".encode()
_DEFAULT_CONTENT_TYPE_LINE = f"Content-Type: {JSON}\r\n".encode()


def _decide(key: bytes) -> str:
    lowered = key.decode("latin-1").lower()
    if not (lowered in _FORWARDED or lowered.startswith(mcp.PARAM_PREFIX)):
        lowered = ""
    if len(_forwarded) < _FORWARDED_MEMO:
        _forwarded[key] = lowered
    return lowered


async def forward(
    pool: Pool,
    replica: Replica,
    request: RPCRequest,
    headers: bytes,
    timeout_s: float,
    downstream: DownstreamRequest,
    *,
    inspect: Inspector | None = None,
    idempotent: bool = False,
    rewrite: Rewriter | None = None,
) -> Reply:
    """POST `request` to `replica` and relay the answer; the upstream call dies with the client.

    `inspect` sees every JSON-RPC message of the answer before it is relayed and may refuse it
    by raising GatewayError (a task whose route could not be recorded). An `idempotent` call
    that times out is safe to retry, so it gets the retryable error rather than a 504. A 4xx
    that is not JSON-RPC is relayed as the backend sent it (status, body, Content-Type); any
    other answer that is not JSON-RPC or SSE is taskgate's 502 or 503.
    `timeout_s` bounds the whole exchange, an event stream included, but not the inspection.
    `rewrite` changes each message of the answer, after its inspection.
    What is read of the answer counts against the process's answer budget, in the account of
    the client's connection (gateway/h1/answers.py): past the budget, reading from the replica
    waits, within the same deadline, until the budget lets it go on.
    """
    upstream = await send(pool, replica, request.id, request.body, headers, timeout_s, idempotent)
    return await relay_answer(
        upstream, pool, replica, request, timeout_s, downstream, inspect, idempotent, rewrite
    )


async def relay_answer(
    upstream: UpstreamResponse,
    pool: Pool,
    replica: Replica,
    request: RPCRequest,
    timeout_s: float,
    downstream: DownstreamRequest,
    inspect: Inspector | None,
    idempotent: bool,
    rewrite: Rewriter | None,
) -> Reply:
    """forward() once the answer's head came (send()): its body relayed, and closed."""
    # The connection is this call's now. Not read to its end means an error or a cancellation
    # (the client went away): it is closed rather than pooled, so the backend sees the
    # disconnect and stops. (No optional local read in `finally`: mypyc would check its type.)
    try:
        account = downstream.answers(pool.answers)
        upstream.charge(account)
        kind = content_type(upstream)
        if kind == EVENT_STREAM:
            return await _relay_sse(upstream, downstream, account, replica, inspect, rewrite)
        rpc = _is_rpc(upstream, replica, request, kind)
        try:
            body = await upstream.read(replica.max_answer_bytes)
        except ExchangeError as broken:
            raise failure(broken, replica, request.id, timeout_s, idempotent) from None
    finally:
        upstream.close()
    if not rpc:
        response = DownstreamResponse(upstream.status, body, upstream.header(b"content-type"))
    else:
        if inspect is not None and body:
            await inspect(_loads(body))
        if rewrite is not None and body:
            changed = rewrite(body)
            if changed is not None:
                body = changed
        response = DownstreamResponse(upstream.status, body, JSON if body else None)
    _copy_back(upstream, response.headers)
    return response


async def relay_stream(
    upstream: UpstreamResponse,
    pool: Pool,
    replica: Replica,
    downstream: DownstreamRequest,
    rewrite: Rewriter | None,
) -> Stream:
    """An event stream answering no request (one resumed with Last-Event-ID) relayed as
    forward() relays a call's stream: under the answer budget, rewritten; then closed."""
    try:
        account = downstream.answers(pool.answers)
        upstream.charge(account)
        return await _relay_sse(upstream, downstream, account, replica, None, rewrite)
    finally:
        upstream.close()


async def forward_whole(
    pool: Pool, replica: Replica, request: RPCRequest, headers: bytes, timeout_s: float
) -> DownstreamResponse:
    """POST `request` to `replica` and read its answer whole, as JSON even from an event stream
    (its answer event; what comes before it is dropped): for an answer that goes out as a part
    of another (a 2025-03-26 batch). The wire's failures are forward()'s."""
    whole = await read_whole(pool, replica, request.id, request.body, headers, timeout_s)
    return DownstreamResponse(whole.status, whole.body, JSON if whole.body else None)


class Whole:
    """An answer read whole: its status and head, and its body, or from an event stream the
    data of the event that answers the request."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status = status
        self.headers = headers  # names lower-cased, as UpstreamResponse holds them
        self.body = body

    def header(self, name: bytes) -> str | None:
        """The first value of a header (`name` lower-case), decoded as latin-1, or None."""
        return header_value(self.headers, name)


async def read_whole(
    pool: Pool,
    replica: Replica,
    request_id: RequestId,
    body: bytes,
    headers: bytes,
    timeout_s: float,
    *,
    idempotent: bool = False,
    max_bytes: int | None = None,
) -> Whole:
    """POST `body` and read the answer to `request_id` whole within `timeout_s` (at most
    `max_bytes`, by default max_answer_bytes; of an event stream, its answer event, no event
    over MAX_EVENT_BYTES): a batch member's answer, and taskgate's own calls (calls.py). The
    wire's failures are forward()'s."""
    limit = replica.max_answer_bytes if max_bytes is None else max_bytes
    upstream = await send(pool, replica, request_id, body, headers, timeout_s, idempotent)
    try:
        _check_encoding(upstream, replica, request_id)
        if content_type(upstream) != EVENT_STREAM:
            answer = await upstream.read(limit)
            return Whole(upstream.status, upstream.headers, answer)
        reader = AnswerReader(request_id, min(limit, MAX_EVENT_BYTES))
        async for chunk in upstream.chunks():
            found = reader.feed(chunk)
            if found is not None:
                return Whole(upstream.status, upstream.headers, found[1].encode())
        raise ExchangeError("the event stream ended without an answer")
    except (ExchangeError, FrameTooLarge) as broken:
        raise failure(broken, replica, request_id, timeout_s, idempotent) from None
    finally:
        upstream.close()


async def send(
    pool: Pool,
    replica: Replica,
    request_id: RequestId | None,
    body: bytes,
    headers: bytes,
    timeout_s: float | None,
    idempotent: bool,
) -> UpstreamResponse:
    """`body` POSTed and the answer's head read within `timeout_s` (the deadline stays on the
    connection for the rest of the exchange; None: none, for a listen its reader ends)."""
    deadline = None if timeout_s is None else pool.now() + timeout_s
    try:
        return await pool.post(replica.url, headers, body, deadline=deadline, idempotent=idempotent)
    except (ConnectFailed, ExchangeError) as failed:
        raise failure(failed, replica, request_id, timeout_s or 0.0, idempotent) from None


async def _relay_sse(
    upstream: UpstreamResponse,
    downstream: DownstreamRequest,
    account: AnswerAccount,
    replica: Replica,
    inspect: Inspector | None,
    rewrite: Rewriter | None,
) -> Stream:
    """Relay an event stream as it comes. forward()'s deadline still runs on the connection;
    past it the stream ends abruptly (the status line is gone by then). Bytes read stay in
    `account` until written (an event being decoded until it is whole, so that an inspected
    event of up to 4 MiB counts against the budget too); the write counts them as unsent."""
    headers = dict(SSE_HEADERS)
    _copy_back(upstream, headers)
    response = downstream.stream(upstream.status, headers)
    decoder = SSEDecoder() if inspect is not None or rewrite is not None else None
    try:
        async for chunk in upstream.chunks():
            if decoder is None:
                await response.write(chunk)
                account.let_go(len(chunk))
                continue
            for frame in decoder.feed(chunk):
                raw = frame.raw
                if frame.data is not None:
                    data = frame.data.encode()
                    if inspect is not None:
                        await inspect(_loads(data))
                    if rewrite is not None:
                        changed = rewrite(data)
                        if changed is None:  # left out
                            account.let_go(len(frame.raw))
                            continue
                        if changed is not data:
                            raw = encode_event(changed.decode(), event=frame.event)
                await response.write(raw)
                account.let_go(len(frame.raw))
        if decoder is not None:
            await response.write(decoder.pending())
    except GatewayError as refused:
        # The status line is gone: the refusal travels as the response event of the stream.
        await response.write(encode_event(refused.body().decode(), event="message"))
    except (ExchangeError, FrameTooLarge) as broken:
        # Nothing sensible can follow a broken stream; ending it abruptly tells the client.
        log.warning("upstream SSE from %s broke off: %s", replica.label, type(broken).__name__)
        downstream.cut()
        return response
    except ConnectionResetError:
        return response  # the client left; the finally of forward() closes upstream
    await response.end()
    return response


def _loads(data: bytes) -> Any:
    """A message for inspection; bytes that are not JSON are relayed uninspected."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def content_type(upstream: UpstreamResponse) -> str:
    """The media type of an answer, lower-cased, without parameters ("" when none)."""
    return (upstream.header(b"content-type") or "").partition(";")[0].strip().lower()


def _is_rpc(
    upstream: UpstreamResponse, replica: Replica, request: RPCRequest, content_type: str
) -> bool:
    """Whether a JSON answer is JSON-RPC. A 4xx in any other form is the backend refusing the
    client's request in its own words (FastMCP's bare 406, a text 413): relayed as it is, not
    blamed; anything else is taskgate's 502 or 503."""
    rpc = content_type == JSON or (upstream.status == 202 and not content_type)
    if not rpc and not 400 <= upstream.status < 500:
        raise unexpected(upstream.status, content_type, replica, request.id)
    _check_encoding(upstream, replica, request.id)
    return rpc


def _check_encoding(
    upstream: UpstreamResponse, replica: Replica, request_id: RequestId | None
) -> None:
    """taskgate asks for no compression; a compressed answer could not be inspected for a task
    to record, so it is refused rather than relayed blind."""
    encoding = upstream.header(b"content-encoding")
    if encoding is not None and encoding.strip().lower() not in ("", "identity"):
        raise bad_gateway(replica, request_id, f"it answered with Content-Encoding {encoding}")


def _copy_back(upstream: UpstreamResponse, headers: dict[str, str]) -> None:
    for key in _RELAYED_BACK:
        value = upstream.header(key.lower().encode())
        if value is not None:
            headers[key] = value
