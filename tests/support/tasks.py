"""Task helpers for gateway tests: create a report task, see raw answers, finish a task."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import aiohttp

from tests.support.mcp import (
    TERMINAL_STATUSES,
    Answer,
    JsonObject,
    build_request,
    mcp_post,
    post_raw,
    result_of,
    wait_for_task_status,
)

# Statuses a report task can be in before anyone answers its approval request.
UNFINISHED = frozenset({"working", "input_required"})
APPROVE = {"action": "accept", "content": {"approved": True}}

_ids = itertools.count(5_000_000)


def next_id() -> int:
    """A JSON-RPC id no other helper hands out."""
    return next(_ids)


async def post(
    http: aiohttp.ClientSession,
    url: str,
    method: str,
    params: Mapping[str, Any] | None = None,
    *,
    id: int | str,
) -> Answer:
    """POST one JSON request (tasks extension declared) and keep the answer's raw bytes."""
    return await post_raw(http, url, build_request(method, params, id=id))


async def create_report(http: aiohttp.ClientSession, url: str, size: str) -> JsonObject:
    """generate_report as a task; the CreateTaskResult, checked."""
    params = {"name": "generate_report", "arguments": {"size": size}}
    status, response = await mcp_post(http, url, "tools/call", params, id=next_id())
    assert status == 200, response
    created = result_of(response)
    assert created["resultType"] == "task", created
    assert created["status"] == "working", created
    return created


async def get_task(http: aiohttp.ClientSession, url: str, task_id: str) -> JsonObject:
    """tasks/get that must resolve: HTTP 200, the same taskId, a complete result."""
    status, response = await mcp_post(http, url, "tasks/get", {"taskId": task_id}, id=next_id())
    assert status == 200, response
    task = result_of(response)
    assert task["taskId"] == task_id, task
    assert task["resultType"] == "complete", task
    return task


async def approve_and_finish(http: aiohttp.ClientSession, url: str, task_id: str) -> JsonObject:
    """Answer the task's approval request through `url` and poll it to a terminal status."""
    parked = await wait_for_task_status(http, url, task_id, {"input_required"})
    (key,) = parked["inputRequests"]
    params = {"taskId": task_id, "inputResponses": {key: APPROVE}}
    status, response = await mcp_post(http, url, "tasks/update", params, id=next_id())
    assert status == 200, response
    assert result_of(response)["resultType"] == "complete"
    return await wait_for_task_status(http, url, task_id, TERMINAL_STATUSES)


def assert_retryable(answer: Answer, request_id: int | str) -> None:
    """The gateway's "try again" answer: 503, Retry-After, -32603 with data.retryable."""
    message = answer.message
    assert answer.status == 503, message
    assert int(answer.headers["Retry-After"]) >= 0
    assert message["id"] == request_id
    assert (message["error"]["code"], message["error"]["data"]) == (-32603, {"retryable": True})
