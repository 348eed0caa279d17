"""Tasks taskgate runs for 2025-era servers without tasks (the Python SDK 1.x), in the caller's
session there or none; a 2025-era server that runs tasks itself keeps its own."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from gateway.protocol.meta import CLIENT_CAPABILITIES_KEY, TASKS_EXTENSION
from gateway.protocol.tasks import MADE_PREFIX, is_made
from tests.support.era2025 import Era2025Process, started
from tests.support.gateway import gateway_config, serving
from tests.support.mcp import mcp_post, poll_until, result_of, wait_for_task_status
from tests.support.node import NodeProject

TERMINAL = frozenset({"completed", "failed", "cancelled"})


@pytest.fixture(params=["py-sdk1", "py-sdk1-stateless"])
def plain_2025(
    request: pytest.FixtureRequest, node_project: NodeProject
) -> Iterator[Era2025Process]:
    with started(request.param, node_project) as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def _config(url: str) -> Any:
    route = {"tools": ["*"], "backend": "old", "task": {"mode": "always"}}
    return gateway_config({"old": [url]}, [route], tasks={"made": {"lease_s": 3}})


async def _call(http: aiohttp.ClientSession, url: str, tool: str, **arguments: Any) -> Any:
    params = {"name": tool, "arguments": arguments}
    status, response = await mcp_post(http, url, "tools/call", params, id=1)
    assert status == 200, response
    return result_of(response)


async def test_a_call_to_a_2025_server_without_tasks_runs_as_a_task_of_taskgates(
    http: aiohttp.ClientSession, plain_2025: Era2025Process
) -> None:
    async with serving(_config(plain_2025.url)) as gateway:
        created = await _call(http, gateway.url, "add", a=2, b=3)
        assert created["resultType"] == "task"
        assert created["taskId"].startswith(MADE_PREFIX)
        done = await wait_for_task_status(http, gateway.url, created["taskId"], TERMINAL)

    assert done["status"] == "completed"
    assert done["result"]["resultType"] == "complete"
    assert done["result"]["content"][0]["text"] == "5"


async def test_cancel_tells_the_2025_server_which_call_to_stop(
    http: aiohttp.ClientSession, plain_2025: Era2025Process
) -> None:
    async with serving(_config(plain_2025.url)) as gateway:
        created = await _call(http, gateway.url, "wait", seconds=60, mark="made")
        await poll_until(lambda: _noted(plain_2025), lambda noted: "started made" in noted)
        _, answer = await mcp_post(
            http, gateway.url, "tasks/cancel", {"taskId": created["taskId"]}, id=2
        )
        assert result_of(answer) == {"resultType": "complete"}
        done = await wait_for_task_status(http, gateway.url, created["taskId"], TERMINAL)
        noted = await poll_until(lambda: _noted(plain_2025), lambda n: "cancelled made" in n)

    assert done["status"] == "cancelled"
    assert noted == ["started made", "cancelled made"]


async def _noted(server: Era2025Process) -> list[str]:
    return server.noted()


async def test_a_2025_server_that_runs_tasks_keeps_its_own(
    http: aiohttp.ClientSession, node_project: NodeProject
) -> None:
    with started("ts-sdk1", node_project) as server:
        async with serving(_config(server.url)) as gateway:
            listed = await mcp_post(http, gateway.url, "tools/list", {}, id=3)
            tools = {tool["name"]: tool for tool in result_of(listed[1])["tools"]}
            task_tool = next(
                name
                for name, tool in tools.items()
                if tool.get("execution", {}).get("taskSupport") in ("optional", "required")
            )
            created = await _call(http, gateway.url, task_tool, **_arguments(tools[task_tool]))

    assert created["resultType"] == "task"
    assert not is_made(created["taskId"])


def _arguments(tool: dict[str, Any]) -> dict[str, Any]:
    """Plain values for a tool's required arguments, by their JSON Schema types."""
    schema = tool.get("inputSchema", {})
    samples = {"string": "x", "number": 1, "integer": 1, "boolean": True}
    properties = schema.get("properties", {})
    return {
        name: samples.get(properties.get(name, {}).get("type"), "x")
        for name in schema.get("required", [])
    }


ASKING: dict[str, Any] = {
    "_meta": {CLIENT_CAPABILITIES_KEY: {"elicitation": {}, "extensions": {TASKS_EXTENSION: {}}}}
}


async def test_a_2025_servers_questions_become_the_tasks_input_required_one_round_each(
    http: aiohttp.ClientSession, plain_2025: Era2025Process
) -> None:
    async with serving(_config(plain_2025.url)) as gateway:
        params = {"name": "survey", "arguments": {}, **ASKING}
        _, response = await mcp_post(http, gateway.url, "tools/call", params, id=4)
        task_id = result_of(response)["taskId"]
        if plain_2025.stateless:
            # No back channel to answer on: the task fails, saying why.
            done = await wait_for_task_status(http, gateway.url, task_id, TERMINAL)
            assert done["status"] == "failed"
            assert "asked elicitation/create during the call" in done["error"]["message"]
            return
        answers = []
        for expected in ("1.taskgate-1", "2.taskgate-2"):
            # tasks/update is taken at once and reaches the holder soon after (EXT: eventually
            # consistent): the task asks the next question once its server asked it.
            asking = await poll_until(
                lambda: _task(http, gateway.url, task_id),
                lambda task, key=expected: key in task.get("inputRequests", {}),  # type: ignore[misc]
            )
            assert asking["status"] == "input_required"
            assert list(asking["inputRequests"]) == [expected]
            question = asking["inputRequests"][expected]
            assert question["method"] == "elicitation/create"
            answer = {"action": "accept", "content": {"ok": expected.startswith("1")}}
            update = {"taskId": task_id, "inputResponses": {expected: answer}}
            _, taken = await mcp_post(http, gateway.url, "tasks/update", update, id=5)
            answers.append(result_of(taken))
        done = await wait_for_task_status(http, gateway.url, task_id, TERMINAL)

    assert answers == [{"resultType": "complete"}] * 2
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == "yes,no"


async def _task(http: aiohttp.ClientSession, url: str, task_id: str) -> Any:
    _, response = await mcp_post(http, url, "tasks/get", {"taskId": task_id}, id=6)
    return result_of(response)
