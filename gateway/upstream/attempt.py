"""One upstream attempt, as both eras' pipelines make it: replicas in order, failing over only
where that is safe, what each replica did reported to its health, the call's duration kept.

The call itself is the caller's (`Attempt`: relay.forward or relay.forward_whole with the
caller's headers and inspection); the wire's failures are already taskgate's errors by then
(relay._failure). What is written here once is what both pipelines must do alike around it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Protocol

from gateway.errors import BadGateway, UpstreamUnavailable, UpstreamUnreachable
from gateway.h1.request import Reply
from gateway.upstream.health import Health
from gateway.upstream.replicas import Replica

log = logging.getLogger("taskgate.handler")

# One upstream call to a replica. The second argument is None, or, when tracing is on, the
# trace headers (traceparent, tracestate) of the call's own span, which replace the client's.
Attempt = Callable[[Replica, dict[str, str] | None], Awaitable[Reply]]


class AttemptRecord(Protocol):
    """What an attempt writes into the request's record (gateway/observe/exchange.py)."""

    replica: str  # the label of the replica last tried
    upstream_s: float  # how long its call took


async def first_reachable(
    health: Health, replicas: list[Replica], attempt: Attempt, seen: AttemptRecord
) -> Reply:
    """Try replicas in order, moving on only when one refused the connection: such a call
    certainly never reached it, so even a non-idempotent tools/call is safe to send again.

    What the replica did reports to its health (passive ejection); what the client or taskgate
    caused does not (docs/operations.md, "What counts against a replica"). Against it: no
    connection, a broken or malformed answer (BadGateway), a 5xx, a timeout of an idempotent
    call (UpstreamUnavailable). Neither way: a 4xx (the backend refused the client's request),
    a tools/call past its deadline (UpstreamTimeout: the tool may be slow for that input), a
    store that could not record a task (a Retryable of taskgate's own), the client leaving."""
    for index, replica in enumerate(replicas):
        seen.replica = replica.label
        started = perf_counter()
        try:
            response = await attempt(replica, None)
        except UpstreamUnreachable as exc:
            seen.upstream_s = perf_counter() - started
            health.failure(replica)
            if index == len(replicas) - 1:
                raise
            log.warning("%s; trying the next replica", exc.message)
            continue
        except (UpstreamUnavailable, BadGateway):
            seen.upstream_s = perf_counter() - started
            health.failure(replica)
            raise
        seen.upstream_s = perf_counter() - started
        status = response.status
        if status < 400:
            health.success(replica)
        elif status >= 500:
            health.failure(replica)
        return response
    raise AssertionError("a route always has at least one replica")
