"""The 2026-07-28 header rules: Mcp-Name where the core requires it, and the version header
compared with the body before the version is judged."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import fastmcp
import fastmcp_tasks  # noqa: F401  # importing it turns on the FastMCP client's task support
import mcp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from tests.gateway.conftest import REPORT_TOOLS
from tests.support.gateway import gateway_config, running_gateway
from tests.support.mcp import META_VERSION, Answer, build_request, post_raw
from tests.support.procs import BackendProcess
from tests.support.tasks import create_report

ids = itertools.count(40_000)
SERVED = "2026-07-28"
FUTURE = "2099-01-01"


@asynccontextmanager
async def taskgate(backends: list[BackendProcess], *, strict: bool) -> AsyncIterator[str]:
    config = gateway_config(
        {"reports": [b.url for b in backends]},
        [(REPORT_TOOLS, "reports")],
        listen={"strict_headers": strict},
    )
    async with running_gateway(config) as url:
        yield url


def refusal(answer: Answer, request_id: int) -> tuple[int, int]:
    """The HTTP status and JSON-RPC code of an error answer that echoes `request_id`."""
    assert answer.message["id"] == request_id, answer.message
    return answer.status, answer.message["error"]["code"]


def echo_call(version: str = SERVED) -> dict[str, Any]:
    body = build_request("tools/call", {"name": "echo", "arguments": {"text": "hi"}}, id=next(ids))
    body["params"]["_meta"][META_VERSION] = version
    return body


# --- Mcp-Name -----------------------------------------------------------------------------


@pytest.mark.parametrize("strict", [False, True], ids=["lenient", "strict"])
async def test_a_tool_call_without_mcp_name_is_400_header_mismatch(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess], strict: bool
) -> None:
    async with taskgate(report_backends, strict=strict) as url:
        body = echo_call()
        answer = await post_raw(http, url, body, drop=("Mcp-Name",))
        assert refusal(answer, body["id"]) == (400, -32020)
        assert "Mcp-Name" in answer.message["error"]["message"]

        served = await post_raw(http, url, echo_call())
        assert served.status == 200
        assert served.message["result"]["structuredContent"] == {"result": "hi"}


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("prompts/get", {"name": "summarise", "arguments": {}}),
        ("resources/read", {"uri": "file:///projects/myapp/config.json"}),
    ],
)
async def test_the_other_name_bearing_methods_without_mcp_name_are_400_header_mismatch(
    http: aiohttp.ClientSession, gateway_url: str, method: str, params: dict[str, Any]
) -> None:
    # The header rule runs before the method table, so it holds whether or not they are routed.
    body = build_request(method, params, id=next(ids))
    answer = await post_raw(http, gateway_url, body, drop=("Mcp-Name",))
    assert refusal(answer, body["id"]) == (400, -32020)


async def test_a_task_get_without_mcp_name_is_routed_on_the_body_by_default(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    task_id = (await create_report(http, gateway_url, "small"))["taskId"]
    body = build_request("tasks/get", {"taskId": task_id}, id=next(ids))
    answer = await post_raw(http, gateway_url, body, drop=("Mcp-Name",))
    assert answer.status == 200
    assert answer.message["result"]["taskId"] == task_id
    assert answer.message["result"]["resultType"] == "complete"


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
async def test_strict_headers_refuse_a_task_request_without_mcp_name(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess], method: str
) -> None:
    async with taskgate(report_backends, strict=True) as url:
        task_id = (await create_report(http, url, "small"))["taskId"]
        body = build_request(method, {"taskId": task_id}, id=next(ids))
        answer = await post_raw(http, url, body, drop=("Mcp-Name",))
        assert refusal(answer, body["id"]) == (400, -32020)

        named = await post_raw(
            http, url, build_request("tasks/get", {"taskId": task_id}, id=next(ids))
        )
        assert named.status == 200
        assert named.message["result"]["taskId"] == task_id


# --- the version header before the version --------------------------------------------------


@pytest.mark.parametrize(
    ("header", "body_version"),
    [(SERVED, "2025-11-25"), (FUTURE, SERVED), (SERVED, FUTURE)],
)
async def test_a_version_header_unlike_the_body_is_400_header_mismatch(
    http: aiohttp.ClientSession, gateway_url: str, header: str, body_version: str
) -> None:
    body = echo_call(body_version)
    answer = await post_raw(http, gateway_url, body, headers={"MCP-Protocol-Version": header})
    assert refusal(answer, body["id"]) == (400, -32020)
    assert answer.message["error"]["data"] == {"header": "MCP-Protocol-Version"}


async def test_a_missing_version_header_is_400_header_mismatch_whatever_the_body_says(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    for version in (SERVED, FUTURE):
        body = echo_call(version)
        answer = await post_raw(http, gateway_url, body, drop=("MCP-Protocol-Version",))
        assert refusal(answer, body["id"]) == (400, -32020)


async def test_a_version_both_name_and_taskgate_does_not_serve_is_400_unsupported(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    body = echo_call(FUTURE)
    answer = await post_raw(http, gateway_url, body, headers={"MCP-Protocol-Version": FUTURE})
    assert refusal(answer, body["id"]) == (400, -32022)
    assert answer.message["error"]["data"] == {"supported": [SERVED], "requested": FUTURE}


@pytest.mark.parametrize(
    ("headers", "drop"),
    [({"Mcp-Method": "tools/list"}, ()), ({}, ("Mcp-Name",)), ({"Mcp-Name": "other"}, ())],
)
async def test_an_unsupported_version_is_named_before_the_other_headers_are_judged(
    http: aiohttp.ClientSession,
    gateway_url: str,
    headers: dict[str, str],
    drop: tuple[str, ...],
) -> None:
    # Another revision may have other header rules: its client learns which version to
    # retry with, and the retry meets the 2026-07-28 rules.
    body = echo_call(FUTURE)
    sent = {"MCP-Protocol-Version": FUTURE, **headers}
    answer = await post_raw(http, gateway_url, body, headers=sent, drop=drop)
    assert refusal(answer, body["id"]) == (400, -32022)


# --- real clients -----------------------------------------------------------------------------


@asynccontextmanager
async def recorded(url: str) -> AsyncIterator[tuple[str, list[CIMultiDict[str]]]]:
    """A pass-through in front of taskgate that keeps the headers of every request."""
    seen: list[CIMultiDict[str]] = []
    hop = {"host", "content-length", "transfer-encoding", "connection"}

    async def forward(request: web.Request) -> web.Response:
        seen.append(CIMultiDict(request.headers))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=await request.read(), headers=headers) as upstream,
        ):
            content_type = upstream.headers.get("Content-Type", "application/json")
            return web.Response(
                status=upstream.status,
                body=await upstream.read(),
                headers={"Content-Type": content_type},
            )

    app = web.Application()
    app.router.add_post("/mcp", forward)
    async with TestServer(app, host="127.0.0.1") as proxy:
        yield str(proxy.make_url("/mcp")), seen


def names_by_method(seen: list[CIMultiDict[str]]) -> dict[str, set[str | None]]:
    sent: dict[str, set[str | None]] = {}
    for headers in seen:
        sent.setdefault(headers["Mcp-Method"], set()).add(headers.get("Mcp-Name"))
    return sent


async def test_the_official_sdk_client_sends_mcp_name_on_a_tool_call(gateway_url: str) -> None:
    async with recorded(gateway_url) as (url, seen), mcp.Client(url) as client:
        result = await client.call_tool("echo", {"text": "via the sdk"})
    assert result.structured_content == {"result": "via the sdk"}
    assert names_by_method(seen)["tools/call"] == {"echo"}


async def test_the_fastmcp_client_names_its_tool_call_and_not_its_task_requests(
    gateway_url: str,
) -> None:
    async def approve(message: str, response_type: Any, params: Any, context: Any) -> Any:
        return {"approved": True}

    async with (
        recorded(gateway_url) as (url, seen),
        fastmcp.Client(url, elicitation_handler=approve) as client,
    ):
        result = await client.call_tool("generate_report", {"size": "small"})
    assert result.structured_content is not None
    assert result.structured_content["approved"] is True
    sent = names_by_method(seen)
    assert sent["tools/call"] == {"generate_report"}
    # fastmcp 4.1.4 sends no Mcp-Name on tasks/*: the lenient default is what serves it.
    assert sent["tasks/get"] == {None}
    assert sent["tasks/update"] == {None}
