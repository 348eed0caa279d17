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
    """A call of taskgate's own to a replica failed; the message says how, for the log.
    `status` is the HTTP status of the replica's answer, None when none came (not reached,
    timed out, broken): whether it is there, and what it said (the era test reads it).
    `cause`: the wire's failure, as the relay would have answered a client, when no answer
    came (a call made for a client's request raises it: UpstreamUnreachable fails over)."""

    def __init__(
        self, message: str, *, status: int | None = None, cause: GatewayError | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.cause = cause


class UpstreamRPCError(UpstreamCallError):
    """The replica answered with a JSON-RPC error: it is there, and said no."""

    def __init__(
        self, message: str, code: object, *, status: int, said: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message, status=status)
        self.code = code
        self.said = said or {}  # the JSON-RPC error object as the replica sent it


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
    result, _ = await request_result(
        pool, replica, method, request_id, body, header_lines(sent_headers), timeout_s
    )
    return result


async def request_result(
    pool: Pool,
    replica: Replica,
    method: str,
    request_id: str,
    body: bytes,
    headers: bytes,
    timeout_s: float,
    *,
    max_bytes: int | None = None,
    idempotent: bool = True,
) -> tuple[dict[str, Any], Whole]:
    """POST a request of taskgate's own (any era's body) and read its answer whole: the
    `result` object and the answer, or UpstreamCallError saying how it failed. `idempotent`
    (taskgate's own reads and cancels are): sent again on a fresh connection when a pooled one
    turns out closed; a request that makes something (a task) is not."""
    try:
        whole = await read_whole(
            pool,
            replica,
            request_id,
            body,
            headers,
            timeout_s,
            idempotent=idempotent,
            max_bytes=max_bytes,
        )
    except GatewayError as failed:
        raise UpstreamCallError(f"{method}: {failed.message}", cause=failed) from None
    message = answer_of(whole)
    where = f"{method} at {replica.label}"
    status = whole.status
    if not isinstance(message, dict):
        raise UpstreamCallError(f"{where}: HTTP {status} without a JSON-RPC answer", status=status)
    result = message.get("result")
    if isinstance(result, dict):
        return result, whole
    error = message.get("error")
    if isinstance(error, dict):
        raise UpstreamRPCError(
            f"{where}: {error.get('message')}", error.get("code"), status=status, said=error
        )
    raise UpstreamCallError(f"{where}: no result", status=status)


def answer_of(whole: Whole) -> Any:
    """The JSON message of an answer read whole, or None when it is empty or not JSON."""
    if not whole.body:
        return None
    try:
        return orjson.loads(whole.body)
    except orjson.JSONDecodeError:
        return None
