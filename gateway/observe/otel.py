"""OpenTelemetry spans for a request, its upstream calls and its store operations.

Loaded only when tracing is on (gateway.observe.tracer.open_tracer), with the `taskgate[otel]`
extra. The handler calls in at three places, each behind one `is None` check: a request span
when a request arrives (OtelTracer.request), a client span around each upstream attempt
(OtelRequestSpan.traced), and the request span's end once the answer is known
(OtelRequestSpan.end, from the Observer). The task router adds its store operations
(OtelTracer.store). Both satisfy the Protocols the rest of taskgate names
(gateway/observe/tracer.py Tracer, gateway/observe/exchange.py RequestSpan).

Attributes never carry a task id as sent (its hash, as the request log has it), a token, a
principal, or a body.
"""

from __future__ import annotations

import asyncio
import time

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import (
    Span,
    SpanKind,
    Status,
    StatusCode,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from gateway.config import TracingConfig
from gateway.h1.headers import Headers
from gateway.h1.request import Reply
from gateway.observe.access import logged_task_hash
from gateway.observe.exchange import Exchange
from gateway.upstream.attempt import Attempt
from gateway.upstream.replicas import Replica

# W3C trace context only: a client's baggage passes upstream untouched
# (gateway/upstream/relay.py), so taskgate neither reads nor rewrites it.
_PROPAGATOR = TraceContextTextMapPropagator()


def export_processor(endpoint: str) -> SpanProcessor:
    """Spans batched and sent to `endpoint` over OTLP/HTTP (protobuf) from the SDK's own thread,
    never from the event loop. Headers and TLS for the collector come from the SDK's
    OTEL_EXPORTER_OTLP_* environment variables."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint))


class OtelTracer:
    """One process's spans: its own TracerProvider (never the global one, so that nothing else
    in the process exports through it), sampling new traces by `sample_ratio` and keeping a
    parent's decision."""

    __slots__ = ("_db_system", "_provider", "_tracer")

    def __init__(
        self,
        config: TracingConfig,
        *,
        db_system: str,
        processor: SpanProcessor | None = None,
    ) -> None:
        if processor is None:
            if config.otlp_endpoint is None:
                raise ValueError("an OtelTracer needs tracing.otlp_endpoint or a span processor")
            processor = export_processor(config.otlp_endpoint)
        # shutdown_on_exit=False: close() shuts it down when the state closes; an atexit hook
        # per provider would also fire for every provider a test made.
        self._provider = TracerProvider(
            sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
            resource=Resource.create({"service.name": config.service_name}),
            shutdown_on_exit=False,
        )
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("taskgate")
        self._db_system = db_system

    def request(self, exchange: Exchange, headers: Headers) -> OtelRequestSpan:
        """The server span of one request, continuing the client's trace or, without a valid
        traceparent, starting one. The exchange takes its trace id, so the request log line of
        a trace taskgate started names it too."""
        carrier: dict[str, str] = {}
        parents = headers.getall("traceparent")
        if len(parents) == 1:  # a repeated traceparent is no parent (W3C trace context)
            carrier["traceparent"] = parents[0]
            states = headers.getall("tracestate")
            if states:  # several lines are one list, as HTTP combines them
                carrier["tracestate"] = ",".join(states)
        parent = _PROPAGATOR.extract(carrier, context=Context())
        span = self._tracer.start_span("mcp", context=parent, kind=SpanKind.SERVER)
        exchange.trace_id = format(span.get_span_context().trace_id, "032x")
        return OtelRequestSpan(self, span, set_span_in_context(span, parent))

    def store(self, operation: str, seconds: float, error: BaseException | None = None) -> None:
        """A span for a store operation that just ended after `seconds`, as a child of the
        request being served (the current context). Made after the fact from the timing the
        task router takes anyway, so the store calls themselves are not wrapped. Outside any
        request (a background poll) there is no trace to add it to, so none is made."""
        if not get_current_span().get_span_context().is_valid:
            return
        ended = time.time_ns()
        span = self._tracer.start_span(
            f"store {operation}",
            kind=SpanKind.CLIENT,
            start_time=ended - int(seconds * 1e9),
            attributes={"db.system": self._db_system, "db.operation.name": operation},
        )
        if error is not None:
            _failed(span, error)
        span.end(end_time=ended)

    async def close(self) -> None:
        """Export what is still batched, then stop. In a thread: the exporter's last POST is a
        blocking one, and the collector may be this very event loop's (a test's) neighbour."""
        await asyncio.to_thread(self._provider.shutdown)


class OtelRequestSpan:
    """A request's server span, current (the OpenTelemetry context) while the request is served,
    so that the store's spans find it as their parent."""

    __slots__ = ("_context", "_ended", "_span", "_token", "_tracer")

    def __init__(self, tracer: OtelTracer, span: Span, context: Context) -> None:
        self._tracer = tracer
        self._span = span
        self._context = context
        self._ended = False
        self._token = otel_context.attach(context)

    def traced(self, attempt: Attempt) -> Attempt:
        """`attempt`, each call in its own client span whose context goes upstream as the
        traceparent (and tracestate) of that call."""
        tracer = self._tracer._tracer
        context = self._context

        async def traced_attempt(replica: Replica, _: dict[str, str] | None) -> Reply:
            span = tracer.start_span(
                f"upstream {replica.backend}",
                context=context,
                kind=SpanKind.CLIENT,
                attributes={"mcp.backend": replica.backend, "mcp.replica": replica.label},
            )
            sent: dict[str, str] = {}
            _PROPAGATOR.inject(sent, context=set_span_in_context(span, context))
            try:
                reply = await attempt(replica, sent)
            except BaseException as exc:  # the replica failed, or the client left: either ends it
                _failed(span, exc)
                span.end()
                raise
            status = reply.status
            span.set_attribute("http.response.status_code", status)
            if status >= 400:  # a client span's error (OpenTelemetry's HTTP conventions)
                span.set_attribute("error.type", str(status))
                span.set_status(Status(StatusCode.ERROR))
            span.end()
            return reply

        return traced_attempt

    def end(self, exchange: Exchange, status: int, code: int | None) -> None:
        """The request was answered: what the request log says of it, as attributes."""
        span = self._span
        if span.is_recording():
            _describe(span, exchange)
            span.set_attribute("http.response.status_code", status)
            if code is not None:
                span.set_attribute("rpc.jsonrpc.error_code", code)
                span.set_attribute("error.type", str(code))
            if status >= 500:  # a server span's error: taskgate's or its backend's failure
                span.set_status(Status(StatusCode.ERROR))
        self._close()

    def abandon(self, exchange: Exchange, exc: BaseException) -> None:
        """The request ended without an answer (the client left, so its handler was cancelled)."""
        span = self._span
        if span.is_recording():
            _describe(span, exchange)
            _failed(span, exc)
        self._close()

    def _close(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._span.end()
        otel_context.detach(self._token)


def _describe(span: Span, exchange: Exchange) -> None:
    method = exchange.method
    span.update_name("mcp" if method == "-" else f"mcp {method}")
    attributes: dict[str, AttributeValue] = {"mcp.method": method}
    if exchange.backend:
        attributes["mcp.backend"] = exchange.backend
    if exchange.replica:
        attributes["mcp.replica"] = exchange.replica
    if exchange.tenant:
        attributes["taskgate.tenant"] = exchange.tenant
    if exchange.task_id is not None:
        attributes["taskgate.task.hash"] = logged_task_hash(exchange)
    span.set_attributes(attributes)


def _failed(span: Span, exc: BaseException) -> None:
    """An error by its type only: exception messages may hold what attributes must not."""
    name = type(exc).__name__
    span.set_attribute("error.type", name)
    span.set_status(Status(StatusCode.ERROR, name))
