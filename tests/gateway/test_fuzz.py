"""Bounded fuzz against a live taskgate: whatever arrives, the answer is a JSON-RPC error or a
result, with a 2xx/4xx status; never a 500, never a crash, and the gateway keeps serving."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.protocol.headers import encode_value
from tests.support.gateway import gateway_config, running_gateway
from tests.support.mcp import mcp_headers

METHODS = [
    "tools/call",
    "tools/list",
    "server/discover",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
    "tasks/result",
    "prompts/get",
    "nope",
    "",
]
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)  # what JSON encoders accept
json_values = st.recursive(
    st.none() | st.booleans() | ints | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
metas = st.fixed_dictionaries(
    {},
    optional={
        "io.modelcontextprotocol/protocolVersion": st.sampled_from(["2026-07-28", "2025-11-25", 7]),
        "io.modelcontextprotocol/clientCapabilities": st.sampled_from(
            [{}, {"extensions": {"io.modelcontextprotocol/tasks": {}}}, [], "x"]
        ),
    },
)
params = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["echo", "headers", "nope", ""])
        | st.text(max_size=10)
        | json_values,
        "taskId": st.text(max_size=12) | json_values,
        "arguments": json_values,
        "_meta": metas | json_values,
    },
)
envelopes = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "1.0", 2])},
    optional={
        "id": ints | st.text(max_size=12) | st.none() | json_values,
        "method": st.sampled_from(METHODS) | json_values,
        "params": params | json_values,
    },
)
header_values = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40
) | st.sampled_from(["=?base64?ZWNobw==?=", "=?base64?%%?=", "  echo  ", "tools/call"])
header_sets = st.dictionaries(
    st.sampled_from(["MCP-Protocol-Version", "Mcp-Method", "Mcp-Name", "Mcp-Param-X", "Origin"]),
    header_values,
    max_size=5,
)


GOOD_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {
        "extensions": {"io.modelcontextprotocol/tasks": {}}
    },
}


@st.composite
def wellformed(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, str]]:
    """A request that passes the envelope checks, so the fuzz reaches routing and relaying."""
    method = draw(st.sampled_from(METHODS[:6]))
    params: dict[str, Any] = {"_meta": GOOD_META}
    if method == "tools/call":
        params["name"] = draw(st.sampled_from(["headers", "echo", "nope", "make_task"]))
        params["arguments"] = draw(st.dictionaries(st.text(max_size=5), json_values, max_size=3))
    elif method.startswith("tasks/"):
        params["taskId"] = draw(st.text(max_size=12) | st.sampled_from(["echo-task-1"]))
    body = {
        "jsonrpc": "2.0",
        "id": draw(ints | st.text(max_size=8)),
        "method": method,
        "params": params,
    }
    headers = mcp_headers(method, params)
    if "Mcp-Name" in headers:  # as a client must send a value that is not plain ASCII
        headers["Mcp-Name"] = encode_value(headers["Mcp-Name"])
    headers.update(draw(header_sets))  # sometimes a header that disagrees
    return body, headers


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    case=st.one_of(wellformed(), st.tuples(envelopes, header_sets)),
    raw=st.booleans(),
    junk=st.binary(max_size=64),
)
def test_any_request_gets_a_json_rpc_answer_and_never_a_500(
    fuzz_target: dict[str, Any],
    case: tuple[dict[str, Any], dict[str, str]],
    raw: bool,
    junk: bytes,
) -> None:
    loop, url, session = fuzz_target["loop"], fuzz_target["url"], fuzz_target["session"]
    envelope, headers = case
    body = junk if raw else orjson.dumps(envelope)
    sent = {"Content-Type": "application/json", **headers}

    async def exchange() -> tuple[int, bytes]:
        async with session.post(url, data=body, headers=sent) as response:
            return response.status, await response.read()

    status, answer = loop.run_until_complete(exchange())
    fuzz_target["statuses"].add(status)
    assert status < 500 or status in (502, 503, 504), (status, answer)
    if status == 202:
        assert answer == b""
        return
    message = orjson.loads(answer)
    assert message["jsonrpc"] == "2.0"
    assert ("result" in message) != ("error" in message)


@pytest.fixture
def fuzz_target() -> Iterator[dict[str, Any]]:
    """taskgate and a raw upstream on one private loop, for the synchronous Hypothesis test."""
    from aiohttp.test_utils import TestServer

    from tests.support.echo_upstream import make_echo_app

    loop = asyncio.new_event_loop()
    upstream = TestServer(make_echo_app(), host="127.0.0.1", loop=loop)
    loop.run_until_complete(upstream.start_server())
    config = gateway_config({"echo": [str(upstream.make_url("/mcp"))]}, [(["*"], "echo")])
    context = running_gateway(config)
    url = loop.run_until_complete(context.__aenter__())
    session = aiohttp.ClientSession(loop=loop)
    try:
        statuses: set[int] = set()
        yield {"loop": loop, "url": url, "session": session, "statuses": statuses}
        # The fuzz reached past the envelope: some requests were served, some refused.
        assert 200 in statuses
        assert statuses & {400, 404}
    finally:
        loop.run_until_complete(session.close())
        loop.run_until_complete(context.__aexit__(None, None, None))
        loop.run_until_complete(upstream.close())
        loop.close()
