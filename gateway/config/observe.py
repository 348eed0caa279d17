"""The `logging` and `tracing` sections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.config.section import Section


class LoggingConfig(Section):
    """Request logs: one line per request, beside taskgate's own log lines."""

    access: bool = Field(True, description="One line per request (docs/operations.md, fields).")
    format: Literal["text", "json"] = Field(
        "text", description="text: key=value lines; json: one JSON object per line."
    )
    recent_errors: int = Field(
        50, ge=0, le=10_000, description="Failed requests the status page keeps, per process."
    )
    max_pending_bytes: int = Field(
        4 * 1024 * 1024,
        ge=4096,
        le=1024 * 1024 * 1024,
        description="Log lines (the request log's and taskgate's own) waiting to be written "
        "to standard error, per process; lines beyond it are dropped and counted "
        "(taskgate_log_lines_dropped_total), and a line says how many once writing resumes.",
    )
    flush_timeout_s: float = Field(
        2.0, ge=0, le=60, description="At exit, the longest wait for pending log lines."
    )


class TracingConfig(Section):
    """W3C trace context; OpenTelemetry export with the optional `taskgate[otel]` extra."""

    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP traces endpoint, the full URL (http://collector:4318/v1/traces); "
        "set, taskgate exports spans for the request, the store and the upstream call, and "
        "starts a trace for a request without traceparent; it needs the taskgate[otel] extra "
        "(else it refuses to start). Unset: an incoming traceparent passes upstream as is.",
    )
    service_name: str = Field(
        "taskgate", description="The service.name of taskgate's spans (their resource)."
    )
    sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of the traces taskgate starts that are sampled; a client's "
        "traceparent keeps its own decision.",
    )
