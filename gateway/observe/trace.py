"""W3C trace context: the trace id a request log line carries, and whether tracing can be on.

Tracing off (no tracing.otlp_endpoint, the default): an incoming traceparent passes upstream as
sent (gateway/upstream/relay.py forwards it), so the backend's spans continue the client's trace
through taskgate, and no OpenTelemetry module is ever imported. On: gateway/observe/otel.py,
loaded by gateway/observe/tracer.py only then, makes taskgate a hop of the trace
(docs/operations.md, "Traces").
"""

from __future__ import annotations

import importlib

from gateway.config import Config

NEEDS_EXTRA = "tracing.otlp_endpoint needs the otel extra: pip install 'taskgate[otel]'"

_EXTRA_MODULES = (
    "opentelemetry.sdk.trace",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
)
_HEX = frozenset("0123456789abcdef")


def trace_id(traceparent: str | None) -> str:
    """The trace id of a valid version-00 traceparent (`00-<32 hex>-<16 hex>-<2 hex>`), else
    "" (absent, malformed, or the all-zero id the recommendation forbids)."""
    if traceparent is None or len(traceparent) != 55:
        return ""
    if traceparent[2] != "-" or traceparent[35] != "-" or traceparent[52] != "-":
        return ""
    trace = traceparent[3:35]
    if not _HEX.issuperset(trace) or trace == "0" * 32:
        return ""
    return trace


def otel_installed() -> bool:
    """Whether the `taskgate[otel]` extra is importable (the SDK and the OTLP/HTTP exporter)."""
    try:
        for module in _EXTRA_MODULES:
            importlib.import_module(module)
    except ImportError:
        return False
    return True


def tracing_warnings(config: Config) -> list[str]:
    """What `taskgate check` should say of tracing: `run` would refuse this machine's install."""
    if config.tracing.otlp_endpoint is not None and not otel_installed():
        return [NEEDS_EXTRA]
    return []
