"""Every task a client hears of is routed to its owner; nothing else reaches any replica."""

from __future__ import annotations

import asyncio
import itertools
import socket
from typing import Any

import aiohttp
import fastmcp
import fastmcp_tasks  # noqa: F401  # importing it turns on the FastMCP client's task support
import orjson
import pytest
import redis.asyncio as aioredis

from gateway.store.base import now_ms
from tests.gateway.conftest import REPORT_TOOLS, EchoUpstream
from tests.support.echo_upstream import HOLD, SEEN, TASK_TTL
from tests.support.gateway import gateway_config, running_gateway, serving
from tests.support.mcp import (
    TASKS_EXTENSION,
    build_request,
    mcp_headers,
    mcp_post,
    poll_until,
    post_raw,
    result_of,
    wait_for_task_status,
)
from tests.support.procs import BackendProcess

ids = itertools.count(20_000)
WAITING = frozenset({"input_required"})
DONE = frozenset({"completed"})


async def create_report(http: aiohttp.ClientSession, url: str, size: str = "small") -> str:
    params = {"name": "generate_report", "arguments": {"size": size}}
    status, response = await mcp_post(http, url, "tools/call", params, id=next(ids))
    result = result_of(response)
    assert status == 200
    assert result["resultType"] == "task"
    return str(result["taskId"])


async def raw_task_call(
    http: aiohttp.ClientSession,
    url: str,
    method: str,
    params: dict[str, Any],
    *,
    request_id: Any = 1,
    tasks: bool = True,
    headers: dict[str, str] | None = None,
    name_header: bool = True,
) -> tuple[int, bytes]:
    body = build_request(method, params, id=request_id, tasks=tasks)
    drop = () if name_header else ("Mcp-Name",)
    answer = await post_raw(http, url, body, headers=headers, drop=drop)
    return answer.status, answer.raw


async def test_tasks_are_routed_to_the_replica_that_created_them(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess]
) -> None:
    # Round robin spreads creations; each replica keeps its tasks in its own memory, so any
    # misrouted poll would answer "Task not found".
    config = gateway_config(
        {"reports": [b.url for b in report_backends]}, [(REPORT_TOOLS, "reports")]
    )
    async with serving(config) as gateway:
        task_ids = [await create_report(http, gateway.url) for _ in range(6)]
        for task_id in task_ids:
            task = await wait_for_task_status(http, gateway.url, task_id, WAITING)
            assert task["taskId"] == task_id
        routes = [await gateway.state.tasks.store.lookup(task_id) for task_id in task_ids]
        assert {route.replica for route in routes if route is not None} == {
            b.url for b in report_backends
        }


async def test_a_task_goes_through_input_to_completion_through_taskgate(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    task_id = await create_report(http, gateway_url, "large")
    task = await wait_for_task_status(http, gateway_url, task_id, WAITING)
    (key,) = task["inputRequests"]
    answer = {"action": "accept", "content": {"approved": True}}
    params = {"taskId": task_id, "inputResponses": {key: answer}}
    _, response = await mcp_post(http, gateway_url, "tasks/update", params, id=next(ids))
    assert result_of(response)["resultType"] == "complete"
    done = await wait_for_task_status(http, gateway_url, task_id, DONE)
    structured = done["result"]["structuredContent"]
    assert structured["size"] == "large"
    assert structured["approved"] is True
    assert structured["replica"] in ("r1", "r2")


async def test_tasks_cancel_reaches_the_owner(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    task_id = await create_report(http, gateway_url)
    _, response = await mcp_post(http, gateway_url, "tasks/cancel", {"taskId": task_id}, id=1)
    assert result_of(response)["resultType"] == "complete"
    task = await wait_for_task_status(http, gateway_url, task_id, frozenset({"cancelled"}))
    assert task["status"] == "cancelled"
    # The route outlives the terminal state: the task can still be read.
    _, again = await mcp_post(http, gateway_url, "tasks/get", {"taskId": task_id}, id=2)
    assert result_of(again)["status"] == "cancelled"


async def test_the_fastmcp_client_drives_a_task_with_input_through_taskgate(
    gateway_url: str,
) -> None:
    asked: list[str] = []

    async def approve(message: str, response_type: Any, params: Any, context: Any) -> Any:
        asked.append(message)
        return {"approved": True}

    async with fastmcp.Client(gateway_url, elicitation_handler=approve) as client:
        result = await client.call_tool("generate_report", {"size": "medium"})
    assert asked
    assert result.structured_content is not None
    assert result.structured_content["size"] == "medium"
    assert result.structured_content["approved"] is True


async def test_task_methods_without_the_extension_are_400_missing_capability(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    task_id = await create_report(http, gateway_url)
    for method in ("tasks/get", "tasks/update", "tasks/cancel"):
        status, raw = await raw_task_call(
            http, gateway_url, method, {"taskId": task_id}, tasks=False
        )
        error = orjson.loads(raw)["error"]
        assert status == 400
        assert error["code"] == -32021
        assert error["data"] == {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}


async def test_an_mcp_name_that_is_not_the_task_id_is_refused(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    task_id = await create_report(http, gateway_url)
    status, raw = await raw_task_call(
        http, gateway_url, "tasks/get", {"taskId": task_id}, headers={"Mcp-Name": "other-task"}
    )
    assert status == 400
    assert orjson.loads(raw)["error"]["code"] == -32020


async def test_an_absent_mcp_name_routes_on_the_task_id(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    task_id = await create_report(http, gateway_url)
    body = build_request("tasks/get", {"taskId": task_id}, id=3)
    headers = mcp_headers("tasks/get", {"taskId": task_id})
    del headers["Mcp-Name"]
    async with http.post(gateway_url, data=orjson.dumps(body), headers=headers) as response:
        assert response.status == 200
        assert (await response.json())["result"]["taskId"] == task_id


@pytest.mark.parametrize(
    "task_id",
    [
        "never-created",
        12345,
        "",
        "x" * 10_000,
        "has spaces in it",
        None,
        {"nested": "object"},
    ],
)
async def test_unknown_and_malformed_task_ids_get_one_identical_answer(
    http: aiohttp.ClientSession, gateway_url: str, task_id: Any
) -> None:
    # Without Mcp-Name (which a 10 kB id would not fit into anyway), the body is routed on.
    reference = await raw_task_call(
        http, gateway_url, "tasks/get", {"taskId": "never-created"}, name_header=False
    )
    params = {"taskId": task_id} if task_id is not None else {}
    for method in ("tasks/get", "tasks/update", "tasks/cancel"):
        answer = await raw_task_call(http, gateway_url, method, params, name_header=False)
        assert answer == reference
    status, raw = reference
    assert status == 200
    assert orjson.loads(raw)["error"]["code"] == -32602


async def test_an_expired_route_answers_like_an_unknown_task(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess]
) -> None:
    config = gateway_config(
        {"reports": [b.url for b in report_backends]}, [(REPORT_TOOLS, "reports")]
    )
    async with serving(config) as gateway:
        task_id = await create_report(http, gateway.url)
        before = await raw_task_call(http, gateway.url, "tasks/get", {"taskId": task_id})
        assert before[0] == 200
        assert orjson.loads(before[1])["result"]["taskId"] == task_id
        await gateway.expire_route(task_id)
        expired = await raw_task_call(http, gateway.url, "tasks/get", {"taskId": task_id})
        unknown = await raw_task_call(http, gateway.url, "tasks/get", {"taskId": "never-created"})
        assert expired == unknown


async def test_a_route_records_owner_replica_and_lifetime(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream
) -> None:
    config = gateway_config({"echo": [echo_upstream.url]}, [(["*"], "echo")])
    config = config.model_copy(update={"tasks": config.tasks.model_copy(update={"grace_s": 5})})
    async with serving(config) as gateway:
        before = now_ms()
        params = {"name": "make_task", "arguments": {"task_id": "t-life", "ttl_ms": 60_000}}
        await mcp_post(http, gateway.url, "tools/call", params, id=1)
        route = await gateway.state.tasks.store.lookup("t-life")
        assert route is not None
        assert (route.backend, route.replica) == ("echo", echo_upstream.url)
        assert (route.tenant, route.principal) == ("", "")  # the anonymous principal
        assert route.ttl_ms == 60_000
        assert before + 65_000 <= route.expires_at_ms <= now_ms() + 65_000


async def test_a_null_ttl_gets_the_configured_cap(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream
) -> None:
    config = gateway_config({"echo": [echo_upstream.url]}, [(["*"], "echo")])
    async with serving(config) as gateway:
        params = {"name": "make_task", "arguments": {"task_id": "t-null", "ttl_ms": None}}
        await mcp_post(http, gateway.url, "tools/call", params, id=1)
        route = await gateway.state.tasks.store.lookup("t-null")
        assert route is not None
        assert route.ttl_ms is None
        seven_days_ms = 7 * 24 * 3600 * 1000
        assert route.expires_at_ms - route.created_at_ms == seven_days_ms + 60_000


async def test_a_changed_ttl_in_tasks_get_moves_the_routes_expiry(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream
) -> None:
    config = gateway_config({"echo": [echo_upstream.url]}, [(["*"], "echo")])
    async with serving(config) as gateway:
        params = {"name": "make_task", "arguments": {"task_id": "t-ttl", "ttl_ms": 60_000}}
        await mcp_post(http, gateway.url, "tools/call", params, id=1)
        first = await gateway.state.tasks.store.lookup("t-ttl")
        assert first is not None
        echo_upstream.app[TASK_TTL]["t-ttl"] = 3_600_000
        await mcp_post(http, gateway.url, "tasks/get", {"taskId": "t-ttl"}, id=2)
        moved = await gateway.state.tasks.store.lookup("t-ttl")
        assert moved is not None
        assert moved.ttl_ms == 3_600_000
        assert moved.expires_at_ms == first.expires_at_ms + 3_600_000 - 60_000


async def test_a_task_announced_in_an_sse_stream_is_recorded_before_it_is_relayed(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream
) -> None:
    config = gateway_config({"echo": [echo_upstream.url]}, [(["*"], "echo")])
    async with serving(config) as gateway:
        params = {"name": "make_task_sse", "arguments": {"task_id": "t-sse"}}
        body = build_request("tools/call", params, id=9)
        headers = mcp_headers("tools/call", params)
        async with http.post(gateway.url, data=orjson.dumps(body), headers=headers) as response:
            assert response.content_type == "text/event-stream"
            raw = await response.read()
        assert b'"taskId":"t-sse"' in raw
        assert raw.startswith(b": starting\n\n")
        assert await gateway.state.tasks.store.lookup("t-sse") is not None
        _, answer = await mcp_post(http, gateway.url, "tasks/get", {"taskId": "t-sse"}, id=10)
        assert result_of(answer)["taskId"] == "t-sse"


# How long Redis holds back writes in the test below: recording a route takes at least this.
WRITE_PAUSE_MS = 1000


async def test_a_task_id_in_a_stream_still_open_reaches_the_client_only_once_it_is_recorded(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, redis_url: str
) -> None:
    # The upstream announces the task and keeps its stream open. Redis holds back writes for
    # a moment (reads go on), so that recording the route takes that long: a relay that did not
    # wait for the record would hand out the id while the store cannot resolve it yet.
    config = gateway_config(
        {"echo": [echo_upstream.url]},
        [(["*"], "echo")],
        store=redis_url,
        tasks={"record_timeout_s": 5 * WRITE_PAUSE_MS / 1000},  # the pause is no failure
    )
    hold = echo_upstream.app[HOLD]
    params = {"name": "make_task_sse", "arguments": {"task_id": "t-open", "hold": True}}
    body = build_request("tools/call", params, id=13)
    headers = mcp_headers("tools/call", params)
    async with serving(config) as gateway, aioredis.Redis.from_url(redis_url) as admin:
        try:
            await admin.execute_command("CLIENT", "PAUSE", WRITE_PAUSE_MS, "WRITE")  # type: ignore[no-untyped-call]
            async with http.post(gateway.url, data=orjson.dumps(body), headers=headers) as response:
                assert response.content_type == "text/event-stream"
                received = b""
                async with asyncio.timeout(10):
                    while b'"taskId":"t-open"' not in received:
                        chunk = await response.content.readany()
                        assert chunk, f"the stream ended early: {received!r}"
                        received += chunk
                # The client holds the id; the stream is still open; the route is there.
                route = await gateway.state.tasks.store.lookup("t-open")
                assert route is not None, "the id was relayed before its route was recorded"
                assert (route.backend, route.replica) == ("echo", echo_upstream.url)
                assert not hold.is_set()
                assert not response.content.at_eof()
                hold.set()
                await response.read()
        finally:
            hold.set()
            await admin.execute_command("CLIENT", "UNPAUSE")  # type: ignore[no-untyped-call]
        _, answer = await mcp_post(http, gateway.url, "tasks/get", {"taskId": "t-open"}, id=14)
        assert result_of(answer)["taskId"] == "t-open"


def dead_redis_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"redis://127.0.0.1:{sock.getsockname()[1]}/0"


@pytest.mark.parametrize("tool", ["make_task", "make_task_sse"])
async def test_a_task_that_cannot_be_recorded_never_reaches_the_client_and_is_cancelled(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, tool: str
) -> None:
    config = gateway_config(
        {"echo": [echo_upstream.url]}, [(["*"], "echo")], store=dead_redis_url()
    )
    async with running_gateway(config) as url:
        params = {"name": tool, "arguments": {"task_id": f"t-lost-{tool}"}}
        body = build_request("tools/call", params, id=11)
        headers = mcp_headers("tools/call", params)
        async with http.post(url, data=orjson.dumps(body), headers=headers) as response:
            raw = await response.read()
            status, retry_after = response.status, response.headers.get("Retry-After")
    assert f"t-lost-{tool}".encode() not in raw
    messages = [
        orjson.loads(line.removeprefix(b"data: "))
        for line in raw.splitlines()
        if line.startswith((b"{", b"data: "))
    ]
    (answer,) = [m for m in messages if m.get("id") == 11]
    assert answer["error"]["code"] == -32603
    assert answer["error"]["data"] == {"retryable": True}
    if tool == "make_task":  # a JSON answer still has its status line to say so
        assert (status, retry_after) == (503, "1")

    def cancelled() -> bool:
        return any(
            orjson.loads(seen["body"])["method"] == "tasks/cancel"
            and orjson.loads(seen["body"])["params"]["taskId"] == f"t-lost-{tool}"
            for seen in echo_upstream.app[SEEN]
        )

    async def probe() -> dict[str, bool]:
        return {"cancelled": cancelled()}

    await poll_until(probe, lambda seen: seen["cancelled"], within=10)


async def test_a_task_id_owned_elsewhere_is_never_handed_to_another_caller(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream
) -> None:
    # Two backends (the same upstream under two names) both announce task "t-dup": the second
    # announcement must not be relayed, and the first owner keeps the route.
    config = gateway_config(
        {"first": [echo_upstream.url], "second": [echo_upstream.url]},
        [(["make_task"], "first"), (["*"], "second")],
    )
    async with serving(config) as gateway:
        params = {"name": "make_task", "arguments": {"task_id": "t-dup"}}
        await mcp_post(http, gateway.url, "tools/call", params, id=1)
        route = await gateway.state.tasks.store.lookup("t-dup")
        assert route is not None
        assert route.backend == "first"
        clash = {"name": "make_task_sse", "arguments": {"task_id": "t-dup"}}
        status, raw = await raw_task_call(http, gateway.url, "tools/call", clash, request_id=2)
        assert b'"resultType":"task"' not in raw
        assert (await gateway.state.tasks.store.lookup("t-dup")) == route
        assert status == 200  # an SSE answer: the refusal is its response event


async def test_an_owner_that_does_not_answer_in_time_is_retryable_not_not_found(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream
) -> None:
    config = gateway_config({"echo": [echo_upstream.url]}, [(["*"], "echo")])
    echo = config.backends["echo"].model_copy(update={"task_timeout_s": 0.3})
    config = config.model_copy(update={"backends": {"echo": echo}})
    async with running_gateway(config) as url:
        params = {"name": "make_task", "arguments": {"task_id": "hang-1"}}
        await mcp_post(http, url, "tools/call", params, id=1)
        body = build_request("tasks/get", {"taskId": "hang-1"}, id=2)
        headers = mcp_headers("tasks/get", {"taskId": "hang-1"})
        async with http.post(url, data=orjson.dumps(body), headers=headers) as response:
            assert response.status == 503
            assert response.headers["Retry-After"] == "1"
            error = (await response.json())["error"]
    assert (error["code"], error["data"]) == (-32603, {"retryable": True})
