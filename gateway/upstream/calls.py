"""taskgate's own JSON-RPC calls to a replica (discovery, catalogue refresh, probes, listen
pollers, best-effort cancels), made as the relay makes a client's: on the same pool of
connections, read whole by the same reader, their failures in the same words
(gateway/upstream/relay.read_whole, gateway/upstream/failures.py)."""

from __future__ import annotations

import itertools
from typing import Any

import orjson

from gateway.errors import GatewayError
from gateway.protocol.meta import CLIENT_CAPABILITIES_KEY, PROTOCOL_VERSION_KEY, SUPPORTED_VERSIONS
from gateway.upstream.pool import Pool
from gateway.upstream.relay import Whole, header_lines, read_whole
from gateway.upstream.replicas import Replica

_ids = itertools.count(1)


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
    pool: Pool,
    replica: Replica,
    method: str,
    params: dict[str, Any] | None = None,
    *,
    timeout_s: float,
    capabilities: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The `result` object of `method` at `replica`, or UpstreamCallError. Every call of
    taskgate's own reads or asks to stop, so each is safe to send again on a fresh connection
    when a pooled one turns out closed."""
    request_id = f"taskgate-{next(_ids)}"
    body, sent_headers = own_request(request_id, method, params, capabilities, headers)
    try:
        whole = await read_whole(
            pool, replica, request_id, body, header_lines(sent_headers), timeout_s, idempotent=True
        )
    except GatewayError as failed:
        raise UpstreamCallError(f"{method}: {failed.message}") from None
    message = answer_of(whole)
    where = f"{method} at {replica.label}"
    if not isinstance(message, dict):
        raise UpstreamCallError(f"{where}: HTTP {whole.status} without a JSON-RPC answer")
    result = message.get("result")
    if isinstance(result, dict):
        return result
    error = message.get("error")
    if isinstance(error, dict):
        raise UpstreamRPCError(f"{where}: {error.get('message')}", error.get("code"))
    raise UpstreamCallError(f"{where}: no result")


def answer_of(whole: Whole) -> Any:
    """The JSON message of an answer read whole, or None when it is empty or not JSON."""
    if not whole.body:
        return None
    try:
        return orjson.loads(whole.body)
    except orjson.JSONDecodeError:
        return None
