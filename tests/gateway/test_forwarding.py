"""tools/call goes to a routed backend's replicas in turn, and comes back as the backend sent it."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from tests.gateway.conftest import EchoUpstream
from tests.support.echo_upstream import HELD_FIRST, HOLD, RELEASE, SEEN, SSE_BODY, make_echo_app
from tests.support.gateway import gateway_config, running_gateway
from tests.support.mcp import (
    build_request,
    mcp_headers,
    mcp_post,
    parse_sse,
    poll_until,
    post_raw,
    result_of,
)
from tests.support.procs import BackendProcess

ids = itertools.count(1000)


def call_body(name: str, arguments: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    body = build_request("tools/call", {"name": name, "arguments": arguments or {}}, id=next(ids))
    body["params"]["_meta"].update(meta)
    return body


async def test_calls_take_the_replicas_in_turn(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    seen = []
    for _ in range(4):
        _, response = await mcp_post(
            http, gateway_url, "tools/call", {"name": "whoami", "arguments": {}}, id=next(ids)
        )
        seen.append(result_of(response)["structuredContent"]["replica"])
    assert sorted(seen) == ["r1", "r1", "r2", "r2"]
    assert seen[0] != seen[1]
    assert seen[1] != seen[2]


async def test_the_answer_is_the_backends_bytes(
    http: aiohttp.ClientSession, gateway_url: str, report_backends: list[BackendProcess]
) -> None:
    body = call_body("echo", {"text": "bytes pass through"})
    body["id"] = "id-kept-as-is"
    direct = await post_raw(http, report_backends[0].url, body)
    through = await post_raw(http, gateway_url, body)
    assert through[0] == direct[0] == 200
    assert through[2] == direct[2]


async def test_sse_is_relayed_event_by_event_exactly_and_unbuffered(
    http: aiohttp.ClientSession, echo_gateway_url: str
) -> None:
    body = call_body("sse_bytes")
    status, headers, raw = await post_raw(http, echo_gateway_url, body)
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    assert headers["X-Accel-Buffering"] == "no"
    assert raw == SSE_BODY % orjson.dumps(body["id"])


async def test_only_mcp_headers_go_upstream_and_never_the_clients_token(
    http: aiohttp.ClientSession, echo_gateway_url: str
) -> None:
    body = call_body("headers")
    extra = {
        "Authorization": "Bearer client-secret",
        "Cookie": "session=1",
        "Mcp-Session-Id": "legacy",
        "Connection": "keep-alive, X-Hop",
        "X-Hop": "hop-by-hop",
        "Mcp-Param-Region": "eu-west",
        "Mcp-Param-Note": "café",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }
    status, _, raw = await post_raw(http, echo_gateway_url, body, headers=extra)
    assert status == 200
    seen = {k.lower(): v for k, v in orjson.loads(raw)["result"]["structuredContent"]["headers"]}
    assert seen["mcp-param-region"] == "eu-west"
    assert seen["mcp-param-note"] == "café"  # the client's bytes, not re-encoded
    assert seen["traceparent"] == extra["traceparent"]
    assert seen["mcp-method"] == "tools/call"
    assert seen["mcp-name"] == "headers"
    for dropped in ("authorization", "cookie", "mcp-session-id", "x-hop"):
        assert dropped not in seen


async def test_mcp_name_is_sent_upstream_even_when_the_client_omitted_it(
    http: aiohttp.ClientSession, echo_gateway_url: str, echo_upstream: EchoUpstream
) -> None:
    # Only tasks/* may omit it: a tools/call without it is refused (test_header_rules.py).
    make = {"name": "make_task", "arguments": {"task_id": "t-unnamed"}}
    await mcp_post(http, echo_gateway_url, "tools/call", make, id=next(ids))
    body = build_request("tasks/get", {"taskId": "t-unnamed"}, id=next(ids))
    headers = mcp_headers("tasks/get", body["params"])
    del headers["Mcp-Name"]
    async with http.post(echo_gateway_url, data=orjson.dumps(body), headers=headers) as response:
        assert response.status == 200
    last = dict((k.lower(), v) for k, v in echo_upstream.app[SEEN][-1]["headers"])
    assert last["mcp-method"] == "tasks/get"
    assert last["mcp-name"] == "t-unnamed"


async def test_the_upstream_body_is_the_clients_bytes(
    http: aiohttp.ClientSession, echo_gateway_url: str, echo_upstream: EchoUpstream
) -> None:
    raw = (
        b'{"jsonrpc":"2.0", "id" : 77,"method":"tools/call","params":{"name":"headers",'
        b'"arguments":{"z":1,"a":2.50},"_meta":{"io.modelcontextprotocol/protocolVersion":'
        b'"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}'
    )
    headers = mcp_headers("tools/call", {"name": "headers"})
    async with http.post(echo_gateway_url, data=raw, headers=headers) as response:
        assert response.status == 200
    assert echo_upstream.app[SEEN][-1]["body"] == raw


async def test_a_dead_replica_is_a_retryable_503(http: aiohttp.ClientSession) -> None:
    # A port nothing listens on: bind one, note it, close it.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = gateway_config({"gone": [f"http://127.0.0.1:{port}/mcp"]}, [(["*"], "gone")])
    async with running_gateway(config) as url:
        body = call_body("anything")
        status, headers, raw = await post_raw(http, url, body)
    assert status == 503
    assert headers["Retry-After"] == "1"
    error = orjson.loads(raw)["error"]
    assert (error["code"], error["data"]) == (-32603, {"retryable": True})


async def test_an_html_503_from_upstream_becomes_a_retryable_json_rpc_error(
    http: aiohttp.ClientSession, echo_gateway_url: str
) -> None:
    body = call_body("html_503")
    status, _, raw = await post_raw(http, echo_gateway_url, body)
    message = orjson.loads(raw)
    assert status == 503
    assert (message["id"], message["error"]["data"]) == (body["id"], {"retryable": True})


async def test_a_compressed_answer_is_refused_rather_than_relayed_uninspected(
    http: aiohttp.ClientSession, echo_gateway_url: str
) -> None:
    # taskgate must read every answer (it may name a task to record); it never asks for
    # compression, so a compressed answer is a backend fault, named as such.
    body = call_body("gzip")
    status, _, raw = await post_raw(http, echo_gateway_url, body)
    error = orjson.loads(raw)["error"]
    assert status == 502
    assert "Content-Encoding gzip" in error["message"]


async def test_a_slow_backend_times_out_with_a_504(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream
) -> None:
    config = gateway_config({"echo": [echo_upstream.url]}, [(["*"], "echo")])
    config = config.model_copy(
        update={"backends": {"echo": config.backends["echo"].model_copy(update={"timeout_s": 0.3})}}
    )
    async with running_gateway(config) as url:
        body = call_body("hang")
        status, _, raw = await post_raw(http, url, body)
    assert status == 504
    assert orjson.loads(raw)["error"]["code"] == -32603


async def test_progress_streams_through_and_a_client_disconnect_cancels_upstream(
    http: aiohttp.ClientSession, gateway_url: str, report_backends: list[BackendProcess]
) -> None:
    async def cancelled_total() -> int:
        total = 0
        for backend in report_backends:
            _, response = await mcp_post(
                http, backend.url, "tools/call", {"name": "stats", "arguments": {}}, id=next(ids)
            )
            total += result_of(response)["structuredContent"]["slow_cancelled"]
        return total

    before = await cancelled_total()
    body = call_body("slow_count", {"n": 50, "delay_ms": 200}, progressToken="tok")
    headers = mcp_headers("tools/call", body["params"])
    async with http.post(gateway_url, data=orjson.dumps(body), headers=headers) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        # The first progress event arrives long before the 10 s the call would take.
        received = b""
        async with asyncio.timeout(5):
            while b"notifications/progress" not in received:
                chunk = await response.content.readany()
                assert chunk, "the stream ended before any progress"
                received += chunk
        response.close()  # the client goes away mid-call
    await poll_until(
        lambda: _as_dict(cancelled_total()), lambda seen: seen["n"] > before, within=10
    )


async def _as_dict(value: Any) -> dict[str, int]:
    return {"n": await value}


async def test_a_call_a_replica_refused_goes_to_the_next_one(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess]
) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    config = gateway_config({"reports": [dead, report_backends[0].url]}, [(["*"], "reports")])
    async with running_gateway(config) as url:
        for _ in range(4):  # whichever replica is next in turn, the call is served
            _, response = await mcp_post(
                http, url, "tools/call", {"name": "whoami", "arguments": {}}, id=next(ids)
            )
            assert result_of(response)["structuredContent"] == {"replica": "r1"}


async def read_until(response: aiohttp.ClientResponse, marker: bytes, within: float = 10) -> bytes:
    """What the client has received of a streamed answer once `marker` is in it."""
    received = b""
    async with asyncio.timeout(within):
        while marker not in received:
            chunk = await response.content.readany()
            assert chunk, f"the stream ended before {marker!r}; received {received!r}"
            received += chunk
    return received


@pytest.mark.parametrize("method", ["tools/call", "tasks/update"])
async def test_an_sse_event_reaches_the_client_while_the_upstream_still_holds_back_the_next(
    http: aiohttp.ClientSession, echo_gateway_url: str, echo_upstream: EchoUpstream, method: str
) -> None:
    # tools/call is relayed frame by frame (each is inspected for a task); tasks/update is
    # relayed chunk by chunk. Either way nothing waits for the end of the stream.
    hold = echo_upstream.app[HOLD]
    if method == "tools/call":
        params: dict[str, Any] = {"name": "sse_held", "arguments": {}}
    else:
        created = {"name": "make_task", "arguments": {"task_id": "held-1"}}
        await mcp_post(http, echo_gateway_url, "tools/call", created, id=next(ids))
        params = {"taskId": "held-1", "inputResponses": {"k": {"action": "accept"}}}
    body = build_request(method, params, id=next(ids))
    headers = mcp_headers(method, body["params"])
    try:
        async with http.post(
            echo_gateway_url, data=orjson.dumps(body), headers=headers
        ) as response:
            assert response.content_type == "text/event-stream"
            first = await read_until(response, b"\n\n")
            assert first == HELD_FIRST
            assert not hold.is_set()  # the upstream is still holding back its answer
            hold.set()
            rest = await response.read()
    finally:
        hold.set()
    (answer,) = parse_sse(rest.decode())
    assert answer["id"] == body["id"]
    assert answer["result"]["resultType"] == "complete"


@asynccontextmanager
async def echo_replicas(count: int) -> AsyncIterator[list[EchoUpstream]]:
    """`count` echo upstreams on loopback, each with its own record of what reached it."""
    servers = [TestServer(make_echo_app(), host="127.0.0.1") for _ in range(count)]
    try:
        for server in servers:
            await server.start_server()
        yield [EchoUpstream(url=str(s.make_url("/mcp")), app=s.app) for s in servers]
    finally:
        for server in servers:  # handlers still waiting to answer may finish
            server.app[RELEASE].set()
            server.app[HOLD].set()
        for server in servers:
            await server.close()


def calls_received(replicas: list[EchoUpstream], tool: str) -> int:
    """How many tools/call of `tool` reached any of the replicas."""
    return sum(
        1
        for replica in replicas
        for seen in replica.app[SEEN]
        if (message := orjson.loads(seen["body"]))["method"] == "tools/call"
        and message["params"]["name"] == tool
    )


@pytest.mark.parametrize(
    ("tool", "status"),
    [pytest.param("html_503", 503, id="a-503-answer"), pytest.param("hang", 504, id="no-answer")],
)
async def test_a_tools_call_a_replica_failed_is_never_sent_to_another_replica(
    http: aiohttp.ClientSession, tool: str, status: int
) -> None:
    # A tools/call need not be idempotent: once a replica may have acted on it (it answered
    # 5xx, or took it and said nothing in time), sending it to the next replica could run it
    # twice. Only a refused connection moves on (test_a_call_a_replica_refused_goes_...).
    async with echo_replicas(2) as replicas:
        config = gateway_config(
            {"echo": [replica.url for replica in replicas]},
            [(["*"], "echo")],
            backend_options={"echo": {"timeout_s": 0.5}},
        )
        async with running_gateway(config) as url:
            body = call_body(tool)
            answer = await post_raw(http, url, body)
        assert answer.status == status
        assert answer.message["id"] == body["id"]
        assert answer.message["error"]["code"] == -32603

        async def received() -> dict[str, int]:
            return {"calls": calls_received(replicas, tool)}

        # The call was sent before the client heard of its failure; its arrival is awaited.
        await poll_until(received, lambda seen: seen["calls"] >= 1, within=10)
        assert calls_received(replicas, tool) == 1
