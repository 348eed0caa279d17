"""After a replica answered a call with a 5xx, taskgate never sends that call to another replica:
the replica may have acted on it, so its failure is the client's answer. Only a refused
connection moves a call on (docs/operations.md, "What counts against a replica"; docs/decisions.md,
11). Two raw replicas behind one backend: one fails as the test says, the other serves; each
records every call that reached it."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.gateway import gateway_config, serving
from tests.support.mcp import Answer, build_request, post_raw

ids = itertools.count(70_000)
# Probes at start only, and no ejection: both replicas stay in turn for every call of the test.
STEADY_HEALTH = {"interval_s": 3600, "unhealthy_after": 1000}
# Calls sent at most, one after another, until each replica has had one: they take turns.
MAX_CALLS = 8
TASK_ID = "shared-task"
CRASHED = {"code": -32603, "message": "the tool crashed"}

Failure = Callable[[Any], web.Response]
# How the failing replica answers the method under test, by case.
FAILURES: dict[str, Failure] = {
    "json-rpc-500": lambda request_id: web.json_response(
        {"jsonrpc": "2.0", "id": request_id, "error": CRASHED}, status=500
    ),
    "json-rpc-503": lambda request_id: web.json_response(
        {"jsonrpc": "2.0", "id": request_id, "error": CRASHED},
        status=503,
        headers={"Retry-After": "7"},
    ),
    "text-500": lambda _: web.Response(status=500, text="Internal Server Error"),
    "html-503": lambda _: web.Response(
        status=503, text="<html>busy</html>", content_type="text/html"
    ),
}

RECEIVED = web.AppKey("received", list)  # the JSON-RPC ids of the calls under test that arrived
FAILING = web.AppKey("failing", str)  # the FAILURES case this replica answers with; "" serves


def replica_app(failing: str) -> web.Application:
    app = web.Application()
    app[RECEIVED] = []
    app[FAILING] = failing
    app.router.add_post("/mcp", _answer)
    return app


def _result(request_id: Any, result: dict[str, Any]) -> web.Response:
    return web.json_response({"jsonrpc": "2.0", "id": request_id, "result": result})


def _task() -> dict[str, Any]:
    stamp = "2026-11-29T00:00:00Z"
    return {
        "taskId": TASK_ID,
        "status": "working",
        "createdAt": stamp,
        "lastUpdatedAt": stamp,
        "ttlMs": 60_000,
    }


async def _answer(request: web.Request) -> web.Response:
    message = orjson.loads(await request.read())
    method, request_id = message["method"], message.get("id")
    if method == "server/discover":
        discovered = {
            "resultType": "complete",
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {}, "extensions": {"io.modelcontextprotocol/tasks": {}}},
            "ttlMs": 0,
            "cacheScope": "public",
        }
        return _result(request_id, discovered)
    if method == "tools/list":
        tools = [{"name": name, "inputSchema": {"type": "object"}} for name in ("act", "make_task")]
        return _result(request_id, {"resultType": "complete", "tools": tools})
    if method == "tools/call" and message["params"]["name"] == "make_task":
        return _result(request_id, {"resultType": "task", **_task()})
    # The call under test: a tools/call of "act", or a tasks/get of the shared task.
    request.app[RECEIVED].append(request_id)
    failing = request.app[FAILING]
    if failing:
        return FAILURES[failing](request_id)
    if method == "tasks/get":
        return _result(request_id, {"resultType": "complete", **_task()})
    return _result(request_id, {"resultType": "complete", "content": [], "structuredContent": {}})


@asynccontextmanager
async def two_replicas(failing: str) -> AsyncIterator[tuple[TestServer, TestServer]]:
    """The failing replica first, the serving one second."""
    servers = (
        TestServer(replica_app(failing), host="127.0.0.1"),
        TestServer(replica_app(""), host="127.0.0.1"),
    )
    try:
        for server in servers:
            await server.start_server()
        yield servers
    finally:
        for server in servers:
            await server.close()


def assert_failure_relayed(answer: Answer, case: str, request_id: int, label: str) -> None:
    """The client's answer to a call the failing replica got: its failure, as the rule says."""
    if case.startswith("json-rpc-"):
        # A JSON-RPC answer is relayed as the replica sent it, its status and Retry-After too.
        status = int(case.rpartition("-")[2])
        assert answer.status == status
        assert answer.message == {"jsonrpc": "2.0", "id": request_id, "error": CRASHED}
        assert answer.headers.get("Retry-After") == ("7" if status == 503 else None)
        return
    error = answer.message["error"]
    assert answer.message["id"] == request_id
    assert error["code"] == -32603
    if case == "text-500":
        assert answer.status == 502
        assert error["message"] == (
            f"Bad gateway: backend 'tools' ({label}): it answered HTTP 500 with text/plain, "
            "not JSON-RPC"
        )
        return
    assert answer.status == 503  # the replica said it is unavailable: the client may retry
    assert answer.headers["Retry-After"] == "1"
    assert error["data"] == {"retryable": True}
    assert error["message"] == "Backend 'tools' is unavailable (HTTP 503 with text/html); retry"


def call_body(method: str) -> dict[str, Any]:
    if method == "tasks/get":
        return build_request("tasks/get", {"taskId": TASK_ID}, id=next(ids))
    return build_request("tools/call", {"name": "act", "arguments": {}}, id=next(ids))


@pytest.mark.parametrize("case", list(FAILURES))
@pytest.mark.parametrize(
    ("method", "affinity"),
    [
        ("tools/call", "replica"),  # not idempotent: a second replica would run the tool again
        ("tasks/get", "backend"),  # idempotent, and any replica may serve the task: still not
    ],
    ids=["tools-call", "tasks-get"],
)
async def test_a_call_a_replica_answered_with_a_5xx_reaches_no_other_replica(
    http: aiohttp.ClientSession, case: str, method: str, affinity: str
) -> None:
    async with two_replicas(case) as (failing, serving_replica):
        config = gateway_config(
            {"tools": [str(s.make_url("/mcp")) for s in (failing, serving_replica)]},
            [(["*"], "tools")],
            backend_options={"tools": {"task_affinity": affinity}},
            health=STEADY_HEALTH,
        )
        async with serving(config) as gateway:
            if method == "tasks/get":
                made = build_request("tools/call", {"name": "make_task"}, id=next(ids))
                created = await post_raw(http, gateway.url, made)
                assert created.message["result"]["taskId"] == TASK_ID
            answers: dict[int, Answer] = {}
            for _ in range(MAX_CALLS):
                body = call_body(method)
                answers[body["id"]] = await post_raw(http, gateway.url, body)
                if failing.app[RECEIVED] and serving_replica.app[RECEIVED]:
                    break
            failed, served = failing.app[RECEIVED], serving_replica.app[RECEIVED]
            assert failed, f"the replicas take turns: {len(answers)} calls never reached it"
            twice = set(failed) & set(served)
            assert not twice, f"calls {sorted(twice)} were sent on to the next replica after a 5xx"
            # Each call reached one replica, once: the tool ran once.
            assert sorted(failed + served) == sorted(answers)
            label = f"127.0.0.1:{failing.port}"
            for request_id in failed:
                assert_failure_relayed(answers[request_id], case, request_id, label)
            for request_id in served:
                assert answers[request_id].status == 200
                assert "result" in answers[request_id].message
