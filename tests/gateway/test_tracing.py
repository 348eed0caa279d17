"""Traces: a client's W3C trace continues through taskgate; with tracing on, taskgate is a hop of
it, with spans for the request, its upstream call and its store operations.

Against the echo upstream, which shows the headers that reached it, and an in-memory exporter in
place of the OTLP one (everything else is the wiring `taskgate run` uses); one test exports to a
real OTLP/HTTP endpoint on loopback.
"""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.config import AuthConfig, Config
from gateway.errors import StartupError
from gateway.observe import otel
from gateway.observe.access import task_hash
from gateway.observe.trace import NEEDS_EXTRA, tracing_warnings
from tests.gateway.conftest import EchoUpstream, leave_mid_call
from tests.support.echo_upstream import SEEN
from tests.support.gateway import gateway_config, serving
from tests.support.issuer import jwt_auth, running_issuer
from tests.support.mcp import build_request, poll_until, post_raw

ids = itertools.count(80_000)
TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"
# Where no collector listens: the in-memory exporter stands in for the OTLP one.
UNUSED_ENDPOINT = "http://127.0.0.1:9/v1/traces"


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Spans taskgate finishes, as they finish, instead of being sent to the endpoint."""
    exporter = InMemorySpanExporter()
    monkeypatch.setattr(otel, "export_processor", lambda endpoint: SimpleSpanProcessor(exporter))
    yield exporter
    exporter.clear()


def traced(echo: EchoUpstream, *, endpoint: str = UNUSED_ENDPOINT, **tracing: Any) -> Config:
    return gateway_config(
        {"echo": [echo.url]},
        [(["*"], "echo")],
        tracing={"otlp_endpoint": endpoint, **tracing},
        logging={"format": "json"},
    )


async def call(
    http: aiohttp.ClientSession,
    url: str,
    method: str,
    params: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> Any:
    return await post_raw(http, url, build_request(method, params, id=next(ids)), headers=headers)


def headers_seen(answer: Any) -> dict[str, str]:
    """What the echo upstream's `headers` tool received, by lower-case name."""
    pairs = answer.message["result"]["structuredContent"]["headers"]
    return {key.lower(): value for key, value in pairs}


def access_lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    err = capsys.readouterr().err
    return [orjson.loads(line) for line in err.splitlines() if '"taskgate.access"' in line]


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def hex_id(value: int, digits: int) -> str:
    return format(value, f"0{digits}x")


def one(found: list[ReadableSpan]) -> ReadableSpan:
    assert len(found) == 1, [span.name for span in found]
    return found[0]


async def test_tracing_off_passes_the_clients_trace_upstream_as_sent_and_logs_its_id(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    config = gateway_config(
        {"echo": [echo_upstream.url]}, [(["*"], "echo")], logging={"format": "json"}
    )
    sent = {"traceparent": TRACEPARENT, "tracestate": "vendor=abc", "baggage": "k=v"}
    async with serving(config) as gateway:
        assert gateway.state.observer.tracer is None
        assert gateway.state.tasks.tracer is None
        answer = await call(http, gateway.url, "tools/call", {"name": "headers"}, sent)
    seen = headers_seen(answer)
    assert {key: seen[key] for key in sent} == sent
    [line] = access_lines(capsys)
    assert line["trace_id"] == TRACE


def test_tracing_off_imports_no_opentelemetry_tracing() -> None:
    # In a fresh interpreter: this one has loaded the SDK for the other tests. (redis-py itself
    # loads opentelemetry's metrics SDK when it is installed; the tracing SDK stays unloaded.)
    script = textwrap.dedent(
        """
        import asyncio, sys
        from gateway.process.app import gateway_state
        from tests.support.gateway import gateway_config

        async def main() -> None:
            config = gateway_config({"echo": ["http://127.0.0.1:9/mcp"]}, [(["*"], "echo")])
            async with gateway_state(config) as state:
                assert state.observer.tracer is None
        asyncio.run(main())
        tracing = ("gateway.observe.otel", "opentelemetry.sdk.trace")
        loaded = [m for m in tracing if m in sys.modules]
        assert not loaded, loaded
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


async def test_an_incoming_trace_continues_through_taskgate_to_the_upstream(
    http: aiohttp.ClientSession,
    echo_upstream: EchoUpstream,
    spans: InMemorySpanExporter,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sent = {"traceparent": TRACEPARENT, "tracestate": "vendor=abc", "baggage": "k=v"}
    async with serving(traced(echo_upstream)) as gateway:
        answer = await call(http, gateway.url, "tools/call", {"name": "headers"}, sent)
    assert answer.status == 200

    server = one(named(spans, "mcp tools/call"))
    assert server.kind is SpanKind.SERVER
    assert server.parent is not None
    assert server.parent.is_remote
    assert hex_id(server.context.trace_id, 32) == TRACE
    assert hex_id(server.parent.span_id, 16) == PARENT
    replica = echo_upstream.url.split("/")[2]
    assert dict(server.attributes or {}) == {
        "mcp.method": "tools/call",
        "mcp.backend": "echo",
        "mcp.replica": replica,
        "http.response.status_code": 200,
    }
    assert server.status.status_code is StatusCode.UNSET

    client = one(named(spans, "upstream echo"))
    assert client.kind is SpanKind.CLIENT
    assert client.parent is not None
    assert client.parent.span_id == server.context.span_id
    assert client.context.trace_id == server.context.trace_id
    assert dict(client.attributes or {}) == {
        "mcp.backend": "echo",
        "mcp.replica": replica,
        "http.response.status_code": 200,
    }

    # The upstream is a child of the client span; the client's tracestate and baggage pass.
    seen = headers_seen(answer)
    assert seen["traceparent"] == f"00-{TRACE}-{hex_id(client.context.span_id, 16)}-01"
    assert seen["tracestate"] == "vendor=abc"
    assert seen["baggage"] == "k=v"
    assert [line["trace_id"] for line in access_lines(capsys)] == [TRACE]


async def test_a_request_without_traceparent_starts_a_trace_the_upstream_and_log_share(
    http: aiohttp.ClientSession,
    echo_upstream: EchoUpstream,
    spans: InMemorySpanExporter,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with serving(traced(echo_upstream)) as gateway:
        answer = await call(http, gateway.url, "tools/call", {"name": "headers"})
    server = one(named(spans, "mcp tools/call"))
    client = one(named(spans, "upstream echo"))
    assert server.parent is None  # a root: taskgate started this trace
    trace = hex_id(server.context.trace_id, 32)
    assert client.context.trace_id == server.context.trace_id
    version, sent_trace, parent, flags = headers_seen(answer)["traceparent"].split("-")
    assert (version, sent_trace, parent) == ("00", trace, hex_id(client.context.span_id, 16))
    assert int(flags, 16) & 1  # sampled (the SDK may add the random-trace-id flag, 0x02)
    assert [line["trace_id"] for line in access_lines(capsys)] == [trace]


async def test_a_created_task_has_a_store_record_span_and_its_polls_name_the_task_hashed(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, spans: InMemorySpanExporter
) -> None:
    async with serving(traced(echo_upstream)) as gateway:
        created = await call(
            http, gateway.url, "tools/call", {"name": "make_task", "arguments": {}}, None
        )
        task_id = created.message["result"]["taskId"]
        polled = await call(http, gateway.url, "tasks/get", {"taskId": task_id})
        assert polled.status == 200

    create, poll = named(spans, "mcp tools/call") + named(spans, "mcp tasks/get")
    record = one(named(spans, "store record"))
    assert record.kind is SpanKind.CLIENT
    assert record.parent is not None
    assert record.parent.span_id == create.context.span_id
    assert dict(record.attributes or {}) == {"db.system": "sqlite", "db.operation.name": "record"}
    # Recorded before relay: the store span ended before the request's did.
    assert record.end_time is not None
    assert create.end_time is not None
    assert record.end_time <= create.end_time
    assert (poll.attributes or {})["taskgate.task.hash"] == task_hash(task_id)
    # The poll found its route in the cache, so it made no store span; its upstream call did.
    assert not named(spans, "store lookup")
    assert len(named(spans, "upstream echo")) == 2
    # Upstream, tasks/get carried the poll's own trace context.
    [get] = [s for s in echo_upstream.app[SEEN] if orjson.loads(s["body"])["method"] == "tasks/get"]
    traceparent = dict((k.lower(), v) for k, v in get["headers"])["traceparent"]
    assert traceparent.split("-")[1] == hex_id(poll.context.trace_id, 32)


async def test_an_unknown_task_is_an_error_code_on_the_span_and_no_span_holds_its_id(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, spans: InMemorySpanExporter
) -> None:
    made_up = "made-up-task-7f3a9c"
    async with running_issuer("ES256") as issuer:
        token = issuer.token(tenant="acme", subject="alice")
        config = traced(echo_upstream).model_copy(
            update={"auth": AuthConfig.model_validate(jwt_auth(issuer))}
        )
        async with serving(config) as gateway:
            answer = await call(
                http,
                gateway.url,
                "tasks/get",
                {"taskId": made_up},
                {"traceparent": TRACEPARENT, "Authorization": f"Bearer {token}"},
            )
    assert answer.message["error"]["code"] == -32602

    server = one(named(spans, "mcp tasks/get"))
    attributes = dict(server.attributes or {})
    assert attributes["rpc.jsonrpc.error_code"] == -32602
    assert attributes["error.type"] == "-32602"
    assert attributes["http.response.status_code"] == 200
    assert "mcp.backend" not in attributes  # no route: no backend was asked
    assert attributes["taskgate.tenant"] == "acme"
    lookup = one(named(spans, "store lookup"))
    assert lookup.parent is not None
    assert lookup.parent.span_id == server.context.span_id
    assert not named(spans, "upstream echo")
    everything = "".join(span.to_json() for span in spans.get_finished_spans())
    for secret in (made_up, "alice", token):  # the task id, the principal, the token
        assert secret not in everything


async def test_new_traces_are_sampled_by_ratio_and_a_parents_decision_is_kept(
    http: aiohttp.ClientSession,
    echo_upstream: EchoUpstream,
    spans: InMemorySpanExporter,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with serving(traced(echo_upstream, sample_ratio=0)) as gateway:
        unsampled = await call(http, gateway.url, "tools/call", {"name": "headers"})
        assert not spans.get_finished_spans()
        sampled = await call(
            http, gateway.url, "tools/call", {"name": "headers"}, {"traceparent": TRACEPARENT}
        )
    # Not sampled is still a trace: the upstream and the log share its id, flagged unsampled.
    version, trace, _, flags = headers_seen(unsampled)["traceparent"].split("-")
    assert version == "00"
    assert not int(flags, 16) & 1
    assert access_lines(capsys)[0]["trace_id"] == trace
    # The client's sampled parent wins over the ratio.
    assert headers_seen(sampled)["traceparent"].startswith(f"00-{TRACE}-")
    assert len(named(spans, "mcp tools/call")) == len(named(spans, "upstream echo")) == 1


async def test_each_attempt_has_its_own_span_and_the_replica_that_served_gets_its_context(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, spans: InMemorySpanExporter
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    config = gateway_config(
        {"echo": [dead, echo_upstream.url]},
        [(["*"], "echo")],
        tracing={"otlp_endpoint": UNUSED_ENDPOINT},
    )
    async with serving(config) as gateway:
        # Whichever replica is first in turn, one of these calls tries the dead one first.
        answers = [await call(http, gateway.url, "tools/call", {"name": "headers"}) for _ in "ab"]
    attempts: dict[int, list[ReadableSpan]] = {}
    for span in named(spans, "upstream echo"):
        assert span.parent is not None
        attempts.setdefault(span.parent.span_id, []).append(span)
    [(failed, served)] = [
        sorted(both, key=lambda span: span.start_time or 0)
        for both in attempts.values()
        if len(both) == 2
    ]
    assert failed.status.status_code is StatusCode.ERROR
    assert (failed.attributes or {})["error.type"] == "UpstreamUnreachable"
    assert (failed.attributes or {})["mcp.replica"] == dead.split("/")[2]
    assert (served.attributes or {})["http.response.status_code"] == 200
    sent = {headers_seen(answer)["traceparent"].split("-")[2] for answer in answers}
    assert hex_id(served.context.span_id, 16) in sent
    assert hex_id(failed.context.span_id, 16) not in sent


async def test_a_client_that_leaves_ends_its_spans_as_cancelled(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, spans: InMemorySpanExporter
) -> None:
    async with serving(traced(echo_upstream)) as gateway:
        await leave_mid_call(http, gateway.url, echo_upstream)

        async def ended() -> list[ReadableSpan]:
            return named(spans, "mcp tools/call")

        [server] = await poll_until(ended, bool, within=10)
    client = one(named(spans, "upstream echo"))
    for span in (server, client):
        assert span.status.status_code is StatusCode.ERROR
        assert (span.attributes or {})["error.type"] == "CancelledError"
    assert (server.attributes or {})["mcp.backend"] == "echo"


async def test_tracing_without_the_otel_extra_refuses_to_start(
    echo_upstream: EchoUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(StartupError) as refused:
        async with serving(traced(echo_upstream)):
            pass
    assert str(refused.value) == NEEDS_EXTRA
    assert tracing_warnings(traced(echo_upstream)) == [NEEDS_EXTRA]  # for `taskgate check`
    assert NEEDS_EXTRA == (
        "tracing.otlp_endpoint needs the otel extra: pip install 'taskgate[otel]'"
    )


@pytest.fixture
async def collector() -> AsyncIterator[tuple[str, list[tuple[str, bytes]]]]:
    """A minimal OTLP/HTTP traces endpoint on loopback: what was POSTed to /v1/traces."""
    received: list[tuple[str, bytes]] = []

    async def accept(request: web.Request) -> web.Response:
        received.append((request.content_type, await request.read()))
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", accept)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("/v1/traces")), received
    finally:
        await server.close()


async def test_spans_are_exported_over_otlp_http_when_the_state_closes(
    http: aiohttp.ClientSession,
    echo_upstream: EchoUpstream,
    collector: tuple[str, list[tuple[str, bytes]]],
) -> None:
    endpoint, received = collector
    async with serving(traced(echo_upstream, endpoint=endpoint, service_name="gw-1")) as gateway:
        await call(http, gateway.url, "tools/call", {"name": "headers"}, None)
    assert tracing_warnings(traced(echo_upstream)) == []
    # Batched: at the latest, the state's close flushes them (from a thread, so this loop
    # serves the collector meanwhile).
    assert received
    names: set[str] = set()
    services: set[str] = set()
    for content_type, body in received:
        assert content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest.FromString(body)
        for resource_spans in export.resource_spans:
            for attribute in resource_spans.resource.attributes:
                if attribute.key == "service.name":
                    services.add(attribute.value.string_value)
            for scope_spans in resource_spans.scope_spans:
                names.update(span.name for span in scope_spans.spans)
    assert services == {"gw-1"}
    assert names == {"mcp tools/call", "upstream echo"}
