"""One request's record, filled in by the handler as it learns each part, read once at its end,
and what a request's trace span must do (taskgate's OpenTelemetry span, gateway/observe/otel.py,
is the one kind; it is loaded only when tracing is on, so nothing here names it)."""

from __future__ import annotations

import time
from typing import Protocol

from gateway.protocol.codes import RequestId
from gateway.upstream.attempt import Attempt


class RequestSpan(Protocol):
    """A request's span while it is served (gateway/observe/otel.py, OtelRequestSpan)."""

    def traced(self, attempt: Attempt) -> Attempt:
        """`attempt`, each call in a client span of its own whose context goes upstream."""
        ...

    def end(self, exchange: Exchange, status: int, code: int | None) -> None:
        """The request was answered with `status` (and taskgate's JSON-RPC `code`, if any)."""
        ...

    def abandon(self, exchange: Exchange, exc: BaseException) -> None:
        """The request ended without an answer."""
        ...


class Exchange:
    """A plain slotted class: the handler builds one per request, so it stays cheap."""

    __slots__ = (
        "answered",
        "backend",
        "code",
        "limit",
        "message",
        "method",
        "replica",
        "request_id",
        "span",
        "started",
        "task_id",
        "tenant",
        "trace_id",
        "upstream_s",
    )

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.request_id: RequestId | None = None  # once the body was read
        self.method = "-"  # the JSON-RPC method, once parsed ("-" before: a refusal)
        self.backend = ""  # the configured backend that answered, "" when none did
        self.replica = ""  # its replica's host:port
        self.tenant = ""  # the verified tenant, once authenticated
        self.task_id: str | None = None  # logged hashed, never as sent
        self.trace_id = ""  # from the W3C traceparent, when there is one
        self.code: int | None = None  # a JSON-RPC error code taskgate itself answered with
        self.message = ""  # taskgate's own error message, for the status page
        self.limit = ""  # the limit that refused it (limits.*: docs/limits.md), "" for none
        self.upstream_s = -1.0  # the upstream call's duration, when one was made
        self.span: RequestSpan | None = None  # the request's span, when tracing is on
        # The answer went out on an event stream before the stream ended: a client that closes
        # the stream then (2025-era clients do) did not leave before its answer.
        self.answered = False
