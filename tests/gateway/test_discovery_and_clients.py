"""taskgate answers discovery itself, and real MCP clients work through it as they do direct."""

from __future__ import annotations

import itertools

import aiohttp
import fastmcp
import fastmcp_tasks  # noqa: F401  # importing it turns on the FastMCP client's task support
import mcp

from tests.support.gateway import gateway_config, running_gateway
from tests.support.mcp import TASKS_EXTENSION, build_request, mcp_post, post_raw, result_of
from tests.support.procs import BackendProcess, free_ports

ids = itertools.count(5000)


async def test_discover_merges_the_backends_and_names_taskgate(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    status, response = await mcp_post(http, gateway_url, "server/discover", {}, id=next(ids))
    result = result_of(response)
    assert status == 200
    assert result["resultType"] == "complete"
    assert result["supportedVersions"] == ["2026-07-28"]
    assert result["capabilities"]["extensions"] == {TASKS_EXTENSION: {}}
    assert "tools" in result["capabilities"]
    assert result["cacheScope"] in ("public", "private")
    assert isinstance(result["ttlMs"], int)
    assert result["ttlMs"] >= 0
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "taskgate"


async def test_tools_list_shows_only_routed_tools_in_route_order(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess]
) -> None:
    urls = [b.url for b in report_backends]
    config = gateway_config(
        {"reports": urls}, [(["whoami", "echo"], "reports"), (["generate_*"], "reports")]
    )
    async with running_gateway(config) as url:
        for _ in range(2):  # the same order every time
            _, response = await mcp_post(http, url, "tools/list", {}, id=next(ids))
            result = result_of(response)
            assert [tool["name"] for tool in result["tools"]] == [
                "echo",
                "whoami",
                "generate_report",
            ]
            assert result["resultType"] == "complete"
            assert "nextCursor" not in result


async def test_a_tool_is_listed_once_under_the_backend_its_route_names(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess]
) -> None:
    first, second = (b.url for b in report_backends)
    config = gateway_config(
        {"first": [first], "second": [second]},
        [(["whoami"], "second"), (["*"], "first")],
    )
    async with running_gateway(config) as url:
        _, response = await mcp_post(http, url, "tools/list", {}, id=next(ids))
        names = [tool["name"] for tool in result_of(response)["tools"]]
        assert names.count("whoami") == 1
        _, response = await mcp_post(
            http, url, "tools/call", {"name": "whoami", "arguments": {}}, id=next(ids)
        )
        assert result_of(response)["structuredContent"] == {"replica": "r2"}


async def test_the_official_sdk_client_lists_and_calls_through_taskgate(gateway_url: str) -> None:
    async with mcp.Client(gateway_url) as client:
        tools = await client.list_tools()
        assert "echo" in {tool.name for tool in tools.tools}
        result = await client.call_tool("echo", {"text": "via the sdk"})
        assert result.structured_content == {"result": "via the sdk"}


async def test_the_fastmcp_client_lists_and_calls_through_taskgate(gateway_url: str) -> None:
    async with fastmcp.Client(gateway_url) as client:
        names = {tool.name for tool in await client.list_tools()}
        assert {"generate_report", "echo", "whoami"} <= names
        result = await client.call_tool("echo", {"text": "via fastmcp"})
        assert result.data == "via fastmcp"


async def test_when_no_backend_answers_discovery_the_client_is_told_to_retry(
    http: aiohttp.ClientSession,
) -> None:
    (dead,) = free_ports(1)
    config = gateway_config({"gone": [f"http://127.0.0.1:{dead}/mcp"]}, [(["*"], "gone")])
    async with running_gateway(config) as url:
        for method in ("tools/list", "server/discover"):
            answer = await post_raw(http, url, build_request(method, {}, id=f"{method}-1"))
            assert answer.status == 503
            assert answer.message["id"] == f"{method}-1"
            assert answer.message["error"]["data"] == {"retryable": True}
