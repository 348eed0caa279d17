"""The report backend on the wire, talked to directly: the facts the gateway relies on."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import fastmcp_tasks  # noqa: F401  # importing it turns on the fastmcp Client's task support
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from fastmcp import Client
from multidict import CIMultiDict

from tests.support.mcp import (
    TASKS_EXTENSION,
    JsonObject,
    build_request,
    mcp_headers,
    mcp_post,
    parse_sse,
    poll_until,
    result_of,
    wait_for_task_status,
)
from tests.support.procs import BackendProcess

# SEP-2663's "missing required client capability" JSON-RPC error code.
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021

ids = itertools.count(1)

ServerFactory = Callable[[web.Application], Awaitable[TestServer]]


async def call_tool(
    http: aiohttp.ClientSession, url: str, name: str, arguments: JsonObject, *, tasks: bool = True
) -> JsonObject:
    """tools/call and return its result."""
    params = {"name": name, "arguments": arguments}
    status, response = await mcp_post(http, url, "tools/call", params, id=next(ids), tasks=tasks)
    assert status == 200, response
    return result_of(response)


async def start_report(http: aiohttp.ClientSession, url: str, size: str) -> str:
    """Call generate_report as a task and return its taskId."""
    created = await call_tool(http, url, "generate_report", {"size": size})
    assert created["resultType"] == "task"
    assert created["status"] == "working"
    task_id: str = created["taskId"]
    return task_id


async def test_discover_advertises_tasks(http: aiohttp.ClientSession, r1: BackendProcess) -> None:
    status, response = await mcp_post(http, r1.url, "server/discover", {}, id=next(ids))
    assert status == 200
    result = result_of(response)
    assert "2026-07-28" in result["supportedVersions"]
    assert TASKS_EXTENSION in result["capabilities"]["extensions"]


async def test_tools_list(http: aiohttp.ClientSession, r1: BackendProcess) -> None:
    status, response = await mcp_post(http, r1.url, "tools/list", {}, id=next(ids))
    assert status == 200
    names = {tool["name"] for tool in result_of(response)["tools"]}
    assert names == {"generate_report", "echo", "whoami", "slow_count", "stats", "set_visible"}


@pytest.mark.parametrize("index", [0, 1])
async def test_whoami_names_the_replica(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess], index: int
) -> None:
    backend = report_backends[index]
    result = await call_tool(http, backend.url, "whoami", {})
    assert result["structuredContent"] == {"replica": backend.name}


async def test_echo(http: aiohttp.ClientSession, r1: BackendProcess) -> None:
    result = await call_tool(http, r1.url, "echo", {"text": "hello"}, tasks=False)
    assert result["structuredContent"] == {"result": "hello"}


async def test_generate_report_task_lifecycle(
    http: aiohttp.ClientSession, r2: BackendProcess
) -> None:
    task_id = await start_report(http, r2.url, "small")

    parked = await wait_for_task_status(http, r2.url, task_id, {"input_required"})
    ((key, request),) = parked["inputRequests"].items()
    assert key.startswith(f"{task_id}:")  # surfaced keys are minted per task, not the tool's
    assert request["method"] == "elicitation/create"
    assert request["params"]["requestedSchema"]["required"] == ["approved"]

    answer = {"action": "accept", "content": {"approved": True}}
    params = {"taskId": task_id, "inputResponses": {key: answer}}
    status, response = await mcp_post(http, r2.url, "tasks/update", params, id=next(ids))
    assert status == 200
    assert result_of(response)["resultType"] == "complete"

    done = await wait_for_task_status(http, r2.url, task_id, {"completed", "failed", "cancelled"})
    assert done["status"] == "completed"
    expected = {"size": "small", "approved": True, "replica": "r2"}
    assert done["result"]["structuredContent"] == expected


async def test_tasks_live_only_on_their_replica(
    http: aiohttp.ClientSession, r1: BackendProcess, r2: BackendProcess
) -> None:
    task_id = await start_report(http, r1.url, "medium")
    await wait_for_task_status(http, r1.url, task_id, {"input_required"})

    status, response = await mcp_post(http, r2.url, "tasks/get", {"taskId": task_id}, id=7)
    # The SDK maps JSON-RPC error codes to HTTP statuses: -32602 travels as a 400.
    assert (status, response["error"]["code"]) == (400, -32602)


async def test_tasks_get_requires_the_capability(
    http: aiohttp.ClientSession, r1: BackendProcess
) -> None:
    task_id = await start_report(http, r1.url, "tiny")
    params = {"taskId": task_id}
    _, response = await mcp_post(http, r1.url, "tasks/get", params, id=8, tasks=False)
    assert response["error"]["code"] == MISSING_REQUIRED_CLIENT_CAPABILITY


async def test_generate_report_without_tasks_asks_inline(
    http: aiohttp.ClientSession, r1: BackendProcess
) -> None:
    """Without the tasks opt-in the call runs in the foreground (SEP-2322 round trips)."""
    first = await call_tool(http, r1.url, "generate_report", {"size": "s"}, tasks=False)
    assert first["resultType"] == "input_required"
    assert list(first["inputRequests"]) == ["approve_outline"]

    answer = {"action": "accept", "content": {"approved": False}}
    params = {
        "name": "generate_report",
        "arguments": {"size": "s"},
        "inputResponses": {"approve_outline": answer},
    }
    _, response = await mcp_post(http, r1.url, "tools/call", params, id=next(ids), tasks=False)
    expected = {"size": "s", "approved": False, "replica": "r1"}
    assert result_of(response)["structuredContent"] == expected


async def test_progress_arrives_on_an_sse_stream(
    http: aiohttp.ClientSession, r1: BackendProcess
) -> None:
    params = {
        "name": "slow_count",
        "arguments": {"n": 3, "delay_ms": 1},
        "_meta": {"progressToken": "p"},
    }
    body = build_request("tools/call", params, id=11, tasks=False)
    async with http.post(r1.url, json=body, headers=mcp_headers("tools/call", params)) as resp:
        assert resp.content_type == "text/event-stream"
        messages = parse_sse(await resp.text())
    progress = [m["params"] for m in messages if m.get("method") == "notifications/progress"]
    assert [(p["progressToken"], p["progress"], p["total"]) for p in progress] == [
        ("p", 1, 3),
        ("p", 2, 3),
        ("p", 3, 3),
    ]
    assert messages[-1]["id"] == 11
    assert messages[-1]["result"]["structuredContent"] == {"result": 3}


async def test_disconnect_cancels_slow_count(
    http: aiohttp.ClientSession, r1: BackendProcess
) -> None:
    before = (await call_tool(http, r1.url, "stats", {}))["structuredContent"]
    params = {
        "name": "slow_count",
        "arguments": {"n": 200, "delay_ms": 50},
        "_meta": {"progressToken": 1},
    }
    body = build_request("tools/call", params, id=12, tasks=False)
    resp = await http.post(r1.url, json=body, headers=mcp_headers("tools/call", params))
    # The first progress event proves the tool is running; then hang up mid-stream.
    async with asyncio.timeout(10):
        async for line in resp.content:
            if b"notifications/progress" in line:
                break
    resp.close()

    async def stats() -> JsonObject:
        result: JsonObject = (await call_tool(http, r1.url, "stats", {}))["structuredContent"]
        return result

    after = await poll_until(stats, lambda s: s["slow_cancelled"] > before["slow_cancelled"])
    assert after["slow_completed"] == before["slow_completed"]


async def test_sigterm_exits_cleanly() -> None:
    with BackendProcess("sigterm") as backend:
        backend.stop()
        assert backend.returncode == 0
        assert "Traceback" not in backend.log_text()


HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


def recording_proxy(upstream: str, seen: list[dict[str, Any]]) -> web.Application:
    """A pass-through proxy recording each request's HTTP verb and headers."""

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append({"verb": request.method, "headers": CIMultiDict(request.headers)})
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with (
            aiohttp.ClientSession() as session,
            session.request(request.method, upstream, data=body, headers=headers) as up,
        ):
            content_type = up.headers.get("Content-Type", "application/json")
            return web.Response(
                status=up.status, body=await up.read(), headers={"Content-Type": content_type}
            )

    app = web.Application()
    app.router.add_route("*", "/mcp", forward)
    return app


async def test_fastmcp_client_drives_the_task(r1: BackendProcess) -> None:
    seen: list[dict[str, Any]] = []
    async with TestServer(recording_proxy(r1.url, seen), host="127.0.0.1") as proxy:

        async def approve(
            message: str, response_type: Any, params: Any, context: Any
        ) -> JsonObject:
            return {"approved": True}

        async with Client(str(proxy.make_url("/mcp")), elicitation_handler=approve) as client:
            result = await client.call_tool("generate_report", {"size": "large"})

    assert result.structured_content == {"size": "large", "approved": True, "replica": "r1"}
    assert {entry["verb"] for entry in seen} == {"POST"}  # no GET stream, no DELETE
    methods = [entry["headers"]["Mcp-Method"] for entry in seen]
    assert methods[:3] == ["server/discover", "tools/call", "tasks/get"]
    assert "tasks/update" in methods
    for entry in seen:
        headers = entry["headers"]
        assert headers["MCP-Protocol-Version"] == "2026-07-28"
        assert headers["Accept"] == "application/json, text/event-stream"
        method = headers["Mcp-Method"]
        # fastmcp 4.1.4 mirrors `name` into Mcp-Name on tools/call but sends no
        # Mcp-Name on tasks/*: the gateway must route those by the body's taskId.
        assert ("Mcp-Name" in headers) == (method == "tools/call"), headers
