"""The optional tracer: what the request pipeline and the task router ask of it, and opening it.

OpenTelemetry is an extra (`taskgate[otel]`): its modules, and gateway/observe/otel.py which
uses them, are imported by open_tracer only when tracing.otlp_endpoint is set, so that a gateway
without tracing neither needs nor loads them. Everything else names the Tracer below.
"""

from __future__ import annotations

from typing import Protocol

from gateway.config import Config
from gateway.errors import StartupError
from gateway.h1.headers import Headers
from gateway.observe.exchange import Exchange, RequestSpan
from gateway.observe.trace import NEEDS_EXTRA, otel_installed


class Tracer(Protocol):
    """One process's spans (gateway/observe/otel.py, OtelTracer)."""

    def request(self, exchange: Exchange, headers: Headers) -> RequestSpan:
        """The server span of one request, continuing the client's trace if it sent one."""
        ...

    def store(self, operation: str, seconds: float, error: BaseException | None = None) -> None:
        """A span for a store operation of the request being served, which took `seconds`."""
        ...

    async def close(self) -> None:
        """Export what is still batched, then stop."""
        ...


def open_tracer(config: Config) -> Tracer | None:
    """The tracer `config.tracing` asks for, exporting to its OTLP endpoint; None when tracing
    is off. StartupError when it is on and the extra is missing: a gateway that was asked to
    trace and silently does not would be found out only when a trace is needed."""
    if config.tracing.otlp_endpoint is None:
        return None
    if not otel_installed():
        raise StartupError(NEEDS_EXTRA)
    from gateway.observe.otel import OtelTracer  # the extra's modules: loaded only now

    db_system = "sqlite" if config.store.url.startswith("sqlite:") else "redis"
    return OtelTracer(config.tracing, db_system=db_system)
