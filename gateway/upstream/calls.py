"""taskgate's own JSON-RPC calls to a replica (discovery, catalogue refresh, best-effort cancel)."""

from __future__ import annotations

import itertools
from typing import Any

import aiohttp
import orjson

from gateway.protocol.meta import CLIENT_CAPABILITIES_KEY, PROTOCOL_VERSION_KEY, SUPPORTED_VERSIONS
from gateway.protocol.sse import AnswerReader, FrameTooLarge
from gateway.upstream.replicas import Replica

_ids = itertools.count(1)
MAX_SSE_FRAME = 4 * 1024 * 1024  # one event of an answer streamed to taskgate's own call


class UpstreamCallError(Exception):
    """A call of taskgate's own to a replica failed; the message says how, for the log."""


class UpstreamRPCError(UpstreamCallError):
    """The replica answered with a JSON-RPC error: it is there, and said no."""

    def __init__(self, message: str, code: object) -> None:
        super().__init__(message)
        self.code = code


def own_request(
    request_id: str,
    method: str,
    params: dict[str, Any] | None,
    capabilities: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a request taskgate makes in its own name: the version it speaks
    first, its `_meta` envelope with `capabilities`, the routing headers, then `headers`."""
    version = SUPPORTED_VERSIONS[0]
    meta = {PROTOCOL_VERSION_KEY: version, CLIENT_CAPABILITIES_KEY: capabilities or {}}
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": method,
        "params": {**(params or {}), "_meta": meta},
    }
    sent_headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": version,
        "Mcp-Method": method,
        **(headers or {}),
    }
    return orjson.dumps(body), sent_headers


async def call(
    session: aiohttp.ClientSession,
    replica: Replica,
    method: str,
    params: dict[str, Any] | None = None,
    *,
    timeout_s: float,
    capabilities: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The `result` object of `method` at `replica`, or UpstreamCallError."""
    request_id = f"taskgate-{next(_ids)}"
    body, sent_headers = own_request(request_id, method, params, capabilities, headers)
    try:
        async with session.post(
            replica.url,
            data=body,
            headers=sent_headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            allow_redirects=False,
        ) as response:
            content_type = response.headers.get("Content-Type", "").partition(";")[0].strip()
            if content_type == "text/event-stream":
                message = await final_sse_message(response, request_id)
            else:
                message = orjson.loads(await _whole(response, replica.max_answer_bytes))
    except TimeoutError:
        raise UpstreamCallError(
            f"{method} at {replica.label}: no answer in {timeout_s:g} s"
        ) from None
    except (aiohttp.ClientError, orjson.JSONDecodeError) as exc:
        raise UpstreamCallError(f"{method} at {replica.label}: {type(exc).__name__}") from None
    if not isinstance(message, dict):
        raise UpstreamCallError(f"{method} at {replica.label}: the answer is not an object")
    result = message.get("result")
    if isinstance(result, dict):
        return result
    error = message.get("error")
    if isinstance(error, dict):
        raise UpstreamRPCError(
            f"{method} at {replica.label}: {error.get('message')}", error.get("code")
        )
    raise UpstreamCallError(f"{method} at {replica.label}: no result")


async def _whole(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """A JSON answer read whole, at most `limit` bytes (the replica's max_answer_bytes): a
    replica must not make taskgate hold what it pleases for its own calls either (a listen
    poller's tasks/get, discovery). ClientPayloadError past it."""
    if response.content_length is not None and response.content_length > limit:
        raise aiohttp.ClientPayloadError(
            f"the answer of {response.content_length} bytes passed {limit}"
        )
    parts: list[bytes] = []
    size = 0
    while chunk := await response.content.read(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise aiohttp.ClientPayloadError(f"the answer passed {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


_CHUNK = 256 * 1024


async def final_sse_message(
    response: aiohttp.ClientResponse, request_id: str, *, max_frame_bytes: int = MAX_SSE_FRAME
) -> Any:
    """The message answering `request_id` in an event stream (AnswerReader). ClientPayloadError
    when the stream ends without it or an event grows past `max_frame_bytes`."""
    reader = AnswerReader(request_id, max_frame_bytes)
    try:
        async for chunk in response.content.iter_any():
            found = reader.feed(chunk)
            if found is not None:
                return found[0]
    except FrameTooLarge:
        raise aiohttp.ClientPayloadError(
            f"an event of the stream passed {max_frame_bytes} bytes"
        ) from None
    raise aiohttp.ClientPayloadError("the event stream ended without an answer")
