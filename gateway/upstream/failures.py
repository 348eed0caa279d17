"""What taskgate says when a call to a replica fails on the wire or answers what is not MCP:
the same words for a client's call (the relay) and for taskgate's own (gateway/upstream/calls.py),
as the GatewayError each failure is, so that replica health and the client's retry follow it."""

from __future__ import annotations

from gateway.errors import (
    BadGateway,
    GatewayError,
    UpstreamTimeout,
    UpstreamUnavailable,
    UpstreamUnreachable,
)
from gateway.protocol.codes import RequestId
from gateway.upstream.framing import ConnectFailed, DeadlineExceeded
from gateway.upstream.replicas import Replica


def failure(
    failed: Exception,
    replica: Replica,
    request_id: RequestId | None,
    timeout_s: float,
    idempotent: bool,
) -> GatewayError:
    """taskgate's answer for a call that failed on the wire: no connection (the call never
    reached the replica), no answer in time, or a broken answer (an event past its bound
    too)."""
    if isinstance(failed, ConnectFailed):
        return UpstreamUnreachable(
            f"Backend {replica.backend!r} is unreachable ({replica.label}: {failed}); retry",
            request_id=request_id,
        )
    if isinstance(failed, DeadlineExceeded):
        return timed_out(replica, request_id, timeout_s, idempotent)
    return bad_gateway(replica, request_id, str(failed))


def timed_out(
    replica: Replica, request_id: RequestId | None, timeout_s: float, idempotent: bool
) -> GatewayError:
    """No answer within `timeout_s`: retryable when the call is safe to send again, else a
    504 (a tools/call may have acted)."""
    message = f"Backend {replica.backend!r} did not answer within {timeout_s:g} s"
    if idempotent:
        return UpstreamUnavailable(f"{message}; retry", request_id=request_id)
    return UpstreamTimeout(message, request_id=request_id)


def unexpected(
    status: int, content_type: str, replica: Replica, request_id: RequestId | None
) -> GatewayError:
    """An answer that is neither JSON-RPC nor an event stream: a 502, 503 or 504 is the
    replica's own unavailability (retryable), anything else a bad gateway."""
    what = f"HTTP {status} with {content_type or 'no content type'}"
    if status in (502, 503, 504):
        return UpstreamUnavailable(
            f"Backend {replica.backend!r} is unavailable ({what}); retry", request_id=request_id
        )
    return bad_gateway(replica, request_id, f"it answered {what}, not JSON-RPC")


def bad_gateway(replica: Replica, request_id: RequestId | None, why: str) -> GatewayError:
    return BadGateway(
        f"Bad gateway: backend {replica.backend!r} ({replica.label}): {why}",
        request_id=request_id,
    )
