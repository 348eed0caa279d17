"""The GatewayError tree and the one place that builds JSON-RPC error bodies.

Every GatewayError subclass lives here, in a module that is never compiled: mypyc drops the
class-level `code`/`status` of a compiled subclass of an interpreted class (issue 17; the test
tests/unit/test_mypyc_rules.py keeps it so)."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.protocol.codes import (
    CapabilityError,
    Code,
    EnvelopeError,
    HeaderError,
    MetaError,
    MethodError,
    ProtocolError,
    RequestId,
    VersionError,
)


class GatewayError(Exception):
    """An answer taskgate gives instead of a backend's: a JSON-RPC error with an HTTP status."""

    code: Code = Code.INTERNAL_ERROR
    status: int = 500

    def __init__(
        self,
        message: str,
        *,
        request_id: RequestId | None = None,
        data: Any = None,
        code: Code | None = None,
        status: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id
        self.data = data
        self.headers = headers or {}
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status

    def body(self) -> bytes:
        return error_body(self.request_id, self.code, self.message, self.data)


class InBandError(GatewayError):
    """A handler error where the core fixes no status: it travels on HTTP 200, as in the TypeScript
    SDK (docs/architecture.md, Sources)."""

    status = 200


class UnknownTool(InBandError):
    code = Code.INVALID_PARAMS

    def __init__(self, name: str, *, request_id: RequestId | None) -> None:
        super().__init__(f"Unknown tool: {name}", request_id=request_id)


class UnknownPrompt(InBandError):
    """A prompt no visible route exposes, or that its backend does not list: the answer of a
    prompt that exists nowhere (invariant 7)."""

    code = Code.INVALID_PARAMS

    def __init__(self, name: str, *, request_id: RequestId | None) -> None:
        super().__init__(f"Unknown prompt: {name}", request_id=request_id)


class ResourceNotFound(InBandError):
    """A resource URI no visible route exposes (by URI, glob or template), or that its backend
    does not serve: the answer of one that exists nowhere (invariant 7). A backend's own
    not-found for a routed URI is normalised to this body too."""

    code = Code.INVALID_PARAMS

    def __init__(self, uri: str, *, request_id: RequestId | None) -> None:
        super().__init__("Resource not found", request_id=request_id, data={"uri": uri})


class BadCursor(InBandError):
    """A list cursor taskgate did not issue (or issued for another list): -32602 on HTTP 200,
    as the core's pagination utility asks of an invalid cursor."""

    code = Code.INVALID_PARAMS

    def __init__(self, *, request_id: RequestId | None = None) -> None:
        super().__init__("Invalid params: cursor is not one taskgate issued", request_id=request_id)


class BadRequestState(InBandError):
    """A retry whose requestState taskgate cannot take: -32602 on HTTP 200, as the core's MRTR
    asks of one that is invalid (gateway/bridge/waiting.py)."""

    code = Code.INVALID_PARAMS


class Retryable(GatewayError):
    """A failure the client may retry as is: 503, Retry-After, -32603 with data.retryable."""

    code = Code.INTERNAL_ERROR
    status = 503

    def __init__(
        self, message: str, *, request_id: RequestId | None = None, retry_after_s: int = 1
    ) -> None:
        super().__init__(
            message,
            request_id=request_id,
            data={"retryable": True},
            headers={"Retry-After": str(retry_after_s)},
        )


class LimitReached(GatewayError):
    """A limit of the caller's own tenant or principal (limits.*): 429 and Retry-After, -32603
    with data {retryable, limit, retryAfterMs}. The core defines no code for it; -32603 with
    data.retryable is what taskgate's other retryable answers carry (docs/limits.md). The
    message names the limit and the caller's own figure, never another tenant's."""

    code = Code.INTERNAL_ERROR
    status = 429

    def __init__(
        self, message: str, *, limit: str, retry_after_ms: int, request_id: RequestId | None = None
    ) -> None:
        seconds = max(1, -(-retry_after_ms // 1000))  # Retry-After counts whole seconds
        wait = f"{retry_after_ms} ms" if retry_after_ms < 1000 else f"{seconds} s"
        super().__init__(
            f"{message}; retry in {wait}",
            request_id=request_id,
            data={"retryable": True, "limit": limit, "retryAfterMs": retry_after_ms},
            headers={"Retry-After": str(seconds)},
        )
        self.limit = limit
        self.retry_after_ms = retry_after_ms


class StoreUnavailable(Retryable):
    """The task store did not answer in time or at all; the caller gets the retryable error.
    (Defined here with every GatewayError: gateway/store/base.py is compiled.)"""


# What a client is told of a Redis store that failed, and of taskgate's pool to it that is full
# (store.max_connections: which says nothing of the store).
CLIENT_MESSAGE = "the task store is unavailable; retry"
BUSY_MESSAGE = "taskgate's connections to the task store are all in use; retry"


class RedisUnavailable(StoreUnavailable):
    """StoreUnavailable that names the store and the cause for the operator, in `str()` (the
    log, /readyz, `taskgate task inspect`), while the answer an MCP client gets (`message`)
    names neither: where the store lives is none of a client's business."""

    def __init__(self, where: str, cause: str, *, busy: bool = False) -> None:
        """`busy`: every connection of taskgate's pool stayed in use, the store itself did not
        fail; the client is told so (BUSY_MESSAGE), still retryable."""
        super().__init__(BUSY_MESSAGE if busy else CLIENT_MESSAGE)
        self.where = where
        self.cause = cause
        self.busy = busy

    def __str__(self) -> str:
        if self.busy:
            return (
                f"taskgate's connections to the task store {self.where} are all in use: "
                f"{self.cause}; retry"
            )
        return f"the task store {self.where} is unavailable: {self.cause}; retry"


class UpstreamUnavailable(Retryable):
    """The replica failed the call in a way the client may retry (5xx, or a timeout of an
    idempotent call). Replica health counts it; a failure of taskgate's own store never is."""


class UpstreamUnreachable(UpstreamUnavailable):
    """No connection to the replica was made, so the request certainly never reached it."""


class UpstreamTimeout(GatewayError):
    """A tools/call got no answer within its deadline; it may have acted, so no retry hint.
    Replica health does not count it: the tool may just be slow for that input."""

    code = Code.INTERNAL_ERROR
    status = 504

    def __init__(self, message: str, *, request_id: RequestId | None = None) -> None:
        super().__init__(message, request_id=request_id, data={"retryable": False})


class BadGateway(GatewayError):
    """502: the backend answered something that is not MCP, or broke the connection."""

    code = Code.INTERNAL_ERROR
    status = 502


class Overloaded(Retryable):
    """A limit is reached: the client should come back shortly (503, Retry-After)."""


class TaskNotFound(InBandError):
    """One answer for unknown, expired, malformed and other principals' task ids (invariant 2,
    docs/architecture.md)."""

    code = Code.INVALID_PARAMS

    def __init__(self, request_id: RequestId) -> None:
        super().__init__("Task not found", request_id=request_id)


class UnsafeHeader(GatewayError):
    """A value taskgate would send upstream as a header could split the request. A guard on
    every header taskgate writes: credentials are checked at start and a token whose tenant or
    subject claim holds a control character is refused when it is verified (gateway/auth/verify),
    so nothing taskgate admits should reach it."""

    status = 400
    code = Code.INVALID_REQUEST


class HTTPRefusal(GatewayError):
    """A refusal at the HTTP layer (403, 405, 406, 408, 413, 415) that still carries a JSON-RPC
    body."""

    code = Code.INVALID_REQUEST


# The one table from protocol errors to HTTP statuses, as the core's Streamable HTTP transport
# fixes them (basic/transports/streamable-http; docs/architecture.md, Sources).
_PROTOCOL_STATUS: dict[type[ProtocolError], int] = {
    EnvelopeError: 400,
    MetaError: 400,
    VersionError: 400,
    HeaderError: 400,
    MethodError: 404,
    CapabilityError: 400,  # -32021 is always 400, even where other errors are in-band
}


def from_protocol(exc: ProtocolError) -> GatewayError:
    """The gateway's answer to a refusal of the sans-IO core."""
    return GatewayError(
        exc.message,
        request_id=exc.request_id,
        data=exc.data,
        code=exc.code,
        status=_protocol_status(exc),
    )


def _protocol_status(exc: ProtocolError) -> int:
    """The status of the nearest class in the table, so a subclass never escapes as a KeyError."""
    for cls in type(exc).__mro__:
        status = _PROTOCOL_STATUS.get(cls)
        if status is not None:
            return status
    return 400  # a bare ProtocolError is still a refusal of the request


def error_body(request_id: RequestId | None, code: int, message: str, data: Any = None) -> bytes:
    """A JSON-RPC error response; `id` is null only where the request's id could not be read."""
    error: dict[str, Any] = {"code": int(code), "message": message}
    if data is not None:
        error["data"] = data
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": error})


class StartupError(Exception):
    """taskgate cannot start as configured; the message says what to change."""


class Unauthorized(GatewayError):
    """401: no usable bearer token. The body and headers say nothing about why, beyond
    `invalid_token` when a token was presented (RFC 6750)."""

    code = Code.INVALID_REQUEST
    status = 401

    def __init__(self, www_authenticate: str) -> None:
        super().__init__(
            "Unauthorized: a valid bearer token is required",
            headers={"WWW-Authenticate": www_authenticate},
        )


class InsufficientScope(GatewayError):
    """403: the token is valid but lacks scopes the route requires; the client may step up."""

    code = Code.INVALID_REQUEST
    status = 403

    def __init__(
        self,
        scopes: tuple[str, ...],
        www_authenticate: str,
        request_id: RequestId,
        *,
        item: str = "tool",
    ) -> None:
        super().__init__(
            f"Forbidden: this {item} needs the scopes {' '.join(scopes)}",
            request_id=request_id,
            headers={"WWW-Authenticate": www_authenticate},
        )


class SessionMissing(HTTPRefusal):
    """A 2025-era request other than initialize without Mcp-Session-Id (the revision's 400)."""

    status = 400

    def __init__(self, request_id: RequestId | None = None) -> None:
        super().__init__(
            "Bad Request: Mcp-Session-Id header is required (send initialize first)",
            request_id=request_id,
        )


class SessionNotFound(GatewayError):
    """Unknown, ended, expired, another caller's, or an upstream session it relied on is gone:
    one answer for all (the revision's 404), so that an id alone reveals nothing; the client
    initializes again."""

    status = 404
    code = Code.INVALID_REQUEST

    def __init__(self, request_id: RequestId | None = None) -> None:
        super().__init__("Session not found", request_id=request_id)
