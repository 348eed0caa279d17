"""The Observer: where each request ends up once answered, counted, logged and, when it failed,
kept among the recent failures the status page shows (or, refused before authentication,
counted apart)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TextIO

import orjson

from gateway.config import LoggingConfig
from gateway.h1.request import DownstreamResponse, Reply
from gateway.observe.access import AccessLog, logged_task_hash
from gateway.observe.exchange import Exchange
from gateway.observe.metrics import RequestMetrics, code_class
from gateway.observe.tracer import Tracer

_JSON = "application/json"
# A failure's message may quote what a client sent (an unknown tool's name): kept this long.
MAX_MESSAGE = 240


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed request, as the status page lists it: no task id, no token, no body."""

    at: float  # time.time()
    method: str
    status: int
    code: int | None
    backend: str
    replica: str
    tenant: str
    task: str  # the hash, as in the request log
    message: str


class Observer:
    __slots__ = ("access", "auth_refusals", "failures", "metrics", "tracer")

    def __init__(self, config: LoggingConfig, *, stream: TextIO | None = None) -> None:
        self.metrics = RequestMetrics()
        self.access = (
            AccessLog(json=config.format == "json", stream=stream) if config.access else None
        )
        self.failures: deque[Failure] = deque(maxlen=config.recent_errors)
        # Refusals anyone can cause without a token: counted here, never kept among the
        # failures, so that they cannot push the real ones out (see `refused_before_auth`).
        self.auth_refusals = 0
        # Spans for each request when tracing is on (gateway/process/app.py sets it), else None.
        self.tracer: Tracer | None = None

    def close(self) -> None:
        """Write what the request log holds (the process is stopping)."""
        if self.access is not None:
            self.access.flush()

    def finish(self, exchange: Exchange, reply: Reply) -> None:
        """Count, log and (when failed) keep one answered request."""
        seconds = time.perf_counter() - exchange.started
        code = exchange.code
        if isinstance(reply, DownstreamResponse):
            status = reply.status
            if code is None and reply.content_type == _JSON:
                code = relayed_error_code(reply.body)
        else:
            status = 200  # a stream: its events are not read here
        self.metrics.request(exchange.method, status, code_class(code), exchange.backend, seconds)
        if exchange.upstream_s >= 0:
            self.metrics.upstream_call(exchange.backend, exchange.upstream_s)
        if self.access is not None:
            self.access.write(exchange, status, code, seconds)
        if exchange.span is not None:
            exchange.span.end(exchange, status, code)
        if status < 400 and code is None:
            return
        if refused_before_auth(exchange, status):
            self.auth_refusals += 1
        elif self.failures.maxlen:
            self.failures.append(
                Failure(
                    at=time.time(),
                    method=exchange.method,
                    status=status,
                    code=code,
                    backend=exchange.backend,
                    replica=exchange.replica,
                    tenant=exchange.tenant,
                    task=logged_task_hash(exchange),
                    message=exchange.message[:MAX_MESSAGE],
                )
            )


def refused_before_auth(exchange: Exchange, status: int) -> bool:
    """taskgate's own 401, or a 403 it answered before knowing the caller: the disallowed
    Origin, checked before the token. Neither names a backend; a verified caller always has
    a tenant (gateway/auth/verify.py), so the 403s that come after authentication (Host,
    insufficient scope) stay among the failures. With `auth: {mode: none}` the one caller has
    no tenant, and a 403 answered before the body was read (Origin, Host) is counted here."""
    if exchange.backend or exchange.tenant:
        return False
    return status == 401 or (status == 403 and exchange.request_id is None)


# A relayed answer is read for its error code only when its start says it is an error, and only
# when it is small: a tool's megabyte result is never parsed here.
_ERROR_PROBE_BYTES = 256
_MAX_PARSED_BYTES = 64 * 1024


def relayed_error_code(body: bytes) -> int | None:
    """The JSON-RPC error code of a backend's whole JSON answer, or None (a result, or not
    JSON-RPC)."""
    if body.find(b'"error"', 0, _ERROR_PROBE_BYTES) < 0 or len(body) > _MAX_PARSED_BYTES:
        return None
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = answer.get("error") if isinstance(answer, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None
