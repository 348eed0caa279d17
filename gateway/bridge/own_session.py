"""taskgate's own 2025-era session on one replica, for what it asks in its own name (discovery
and the catalogue's refreshes).

Opened with `initialize` in the newest 2025 revision (the server answers with the revision it
speaks, which must be one of the three), then `notifications/initialized`; each request on it
names the session (`Mcp-Session-Id`; none for a stateless server, which assigns none) and, from
2025-06-18 on, the revision (`MCP-Protocol-Version`). A 404 on a request of a session means the
replica no longer knows it (it restarted, or expired it): SessionGone, and the caller opens a
new one. taskgate declares no client capability on it: it answers no question of the server.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import GatewayError, UnsafeHeader
from gateway.protocol.era import LEGACY_VERSIONS, SESSION_HEADER, legacy_headers
from gateway.upstream.calls import UpstreamCallError, request_result
from gateway.upstream.framing import ConnectFailed, ExchangeError
from gateway.upstream.pool import Pool
from gateway.upstream.relay import header_lines, send
from gateway.upstream.replicas import Replica

_ids = itertools.count(1)
_JSON = "application/json"
_ACCEPT = "application/json, text/event-stream"
_SESSION_KEY = SESSION_HEADER.lower().encode("ascii")
# An initialize result, a list page or a notification's answer is small: more is not a
# backend's answer to taskgate.
MAX_ANSWER = 4 * 1024 * 1024
_CLIENT_INFO = {"name": "taskgate", "version": "0"}
# The error a server's question gets when taskgate cannot put it to the client.
CANNOT_ASK = -32601
_INITIALIZED = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'


class SessionGone(UpstreamCallError):
    """The replica answered 404 on a request of the session: it no longer knows it."""


@dataclass(frozen=True, slots=True)
class Opened:
    """A session taskgate opened: its id ("" when the server is stateless), the revision the
    server chose, and its initialize result (capabilities, serverInfo, instructions)."""

    session_id: str
    version: str
    result: dict[str, Any]

    @property
    def headers(self) -> dict[str, str]:
        """The headers that name the session and its revision on each request."""
        return legacy_headers(self.session_id, self.version)


async def initialize(
    pool: Pool,
    replica: Replica,
    headers: dict[str, str],
    timeout_s: float,
    *,
    capabilities: dict[str, Any] | None = None,
    client_info: dict[str, Any] | None = None,
) -> Opened:
    """Open a session on `replica` (declaring `capabilities`, none by default, and
    `client_info`, taskgate's by default); UpstreamCallError when it refuses, or answers with a
    revision that is not of the 2025 era."""
    params = {
        "protocolVersion": LEGACY_VERSIONS[-1],
        "capabilities": capabilities or {},
        "clientInfo": client_info or _CLIENT_INFO,
    }
    request_id = f"taskgate-initialize-{next(_ids)}"
    sent = header_lines({**headers, "Content-Type": _JSON, "Accept": _ACCEPT})
    result, whole = await request_result(
        pool,
        replica,
        "initialize",
        request_id,
        _request(request_id, "initialize", params),
        sent,
        timeout_s,
        max_bytes=MAX_ANSWER,
    )
    where = f"initialize at {replica.label}"
    version = result.get("protocolVersion")
    if not isinstance(version, str) or version not in LEGACY_VERSIONS:
        raise UpstreamCallError(f"{where}: the server chose protocol version {version!r}")
    session_id = whole.header(_SESSION_KEY) or ""
    if session_id and not visible_ascii(session_id):
        raise UpstreamCallError(f"{where}: its Mcp-Session-Id is not visible ASCII")
    opened = Opened(session_id, version, result)
    await notify(pool, replica, opened, headers, _INITIALIZED, timeout_s)
    return opened


async def ask(
    pool: Pool,
    replica: Replica,
    opened: Opened,
    headers: dict[str, str],
    method: str,
    params: dict[str, Any],
    timeout_s: float,
    *,
    max_bytes: int = MAX_ANSWER,
    idempotent: bool = True,
    request_id: str | None = None,
) -> dict[str, Any]:
    """The result of `method` asked on the session (at most `max_bytes`; `idempotent`: see
    request_result; `request_id`: the id to send, that a notifications/cancelled can name);
    SessionGone on a 404."""
    if request_id is None:
        request_id = f"taskgate-{next(_ids)}"
    sent = header_lines({**headers, **opened.headers, "Content-Type": _JSON, "Accept": _ACCEPT})
    try:
        result, _ = await request_result(
            pool,
            replica,
            method,
            request_id,
            _request(request_id, method, params),
            sent,
            timeout_s,
            max_bytes=max_bytes,
            idempotent=idempotent,
        )
    except UpstreamCallError as failed:
        if failed.status == 404 and opened.session_id:
            raise SessionGone(str(failed), status=404) from None
        raise
    return result


async def notify(
    pool: Pool,
    replica: Replica,
    opened: Opened,
    headers: dict[str, str],
    body: bytes,
    timeout_s: float,
) -> int | None:
    """POST a notification (or an answer to the server's request) on the session: its HTTP
    status (202 when accepted), or None when the replica could not be reached. Best effort: the
    caller decides what a failure means."""
    sent = {**headers, **opened.headers, "Content-Type": _JSON, "Accept": _ACCEPT}
    try:
        response = await send(pool, replica, None, body, header_lines(sent), timeout_s, False)
    except GatewayError:  # not reached (or an identity that cannot go in a header)
        return None
    try:
        await response.read(MAX_ANSWER)
    except ExchangeError:
        pass  # the status came: what follows it does not change what it said
    finally:
        response.close()
    return response.status


async def end(
    pool: Pool, replica: Replica, opened: Opened, headers: dict[str, str], timeout_s: float
) -> str | None:
    """DELETE the session (best effort: a replica that misses it expires the session itself);
    why it failed, or None."""
    if not opened.session_id:
        return None  # a stateless server has nothing to end
    deadline = asyncio.get_running_loop().time() + timeout_s
    try:
        sent = header_lines({**headers, **opened.headers})
        response = await pool.bodiless(b"DELETE", replica.url, sent, deadline=deadline)
        try:
            await response.read(MAX_ANSWER)
        finally:
            response.close()
    except (ConnectFailed, ExchangeError, UnsafeHeader) as failed:
        return str(failed)
    return None


def visible_ascii(value: str) -> bool:
    """Whether a session id is what the 2025 transport allows (and fits a header line)."""
    return len(value) <= 512 and all(0x21 <= ord(c) <= 0x7E for c in value)


def _request(request_id: str, method: str, params: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})


def declined(question: dict[str, Any]) -> bytes:
    """The answer to a server's question that taskgate cannot put to a 2026-07-28 client."""
    asked = question.get("method")
    return orjson.dumps(
        {
            "jsonrpc": "2.0",
            "id": question.get("id"),
            "error": {"code": CANNOT_ASK, "message": f"taskgate cannot put {asked} to the client"},
        }
    )
