"""Only what a replica did counts against it: what a client caused never ejects a replica that
serves everyone else (docs/operations.md, "What counts against a replica")."""

from __future__ import annotations

import asyncio
import io
import itertools
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from gateway.ops.admin import make_admin_app
from gateway.pipeline.state import Gateway
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.mcp import Answer, build_request, mcp_headers, poll_until
from tests.support.procs import BackendProcess

ids = itertools.count(5000)
BOTH = "application/json, text/event-stream"
# Probes at start only, so that what calls report is all the test sees after the first one;
# an ejected replica stays out (nothing the test does could bring it back in).
QUIET_HEALTH = {"interval_s": 3600, "healthy_after": 1000}


def tool_call(name: str, **arguments: Any) -> dict[str, Any]:
    return build_request("tools/call", {"name": name, "arguments": arguments}, id=next(ids))


async def post(
    http: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    *,
    accept: tuple[str, ...] | None = (BOTH,),
    token: str | None = None,
) -> Answer:
    """POST `body` with exactly the Accept lines given (None: no Accept header at all)."""
    headers: CIMultiDict[str] = CIMultiDict(mcp_headers(body["method"], body["params"]))
    del headers["Accept"]
    for value in accept or ():
        headers.add("Accept", value)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with http.post(
        url, data=orjson.dumps(body), headers=headers, skip_auto_headers=("Accept",)
    ) as response:
        return Answer(response.status, CIMultiDict(response.headers), await response.read())


def healthy(state: Gateway) -> dict[str, bool]:
    return {
        replica.url: state.health.healthy(replica)
        for backend in state.backends.values()
        for replica in backend.replicas
    }


async def probed(state: Gateway) -> None:
    """Wait for the probe taskgate sends every replica at start: a success it reports later
    would reset the count of consecutive failures a test is building up."""

    async def seen() -> dict[str, bool]:
        return {"all": all(url in state.health._states for url in healthy(state))}

    await poll_until(seen, lambda probes: probes["all"], within=10)


# -- the measured attack, against real FastMCP replicas -----------------------------------------


async def test_one_tenant_sending_json_only_accept_cannot_eject_the_replicas_another_needs(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    # Measured before: FastMCP answered these 406, taskgate relayed 502 and counted a failure;
    # three of them every 0.5 s made another tenant's calls fail with 503 (replica ejected).
    config = gateway_config(
        {"reports": [b.url for b in report_backends]},
        [(["whoami", "echo"], "reports")],
        auth=jwt_auth(issuer),
        health={**QUIET_HEALTH, "unhealthy_after": 3},
    )
    attacker, victim = issuer.token("acme", "mallory"), issuer.token("globex", "gina")
    async with serving(config) as gateway:
        admin = TestServer(make_admin_app(gateway.state), host="127.0.0.1")
        await admin.start_server()
        try:
            await probed(gateway.state)
            json_only = ("application/json",)
            for _ in range(8):  # 24 refused requests: 8 times unhealthy_after
                for _ in range(3):
                    body = tool_call("echo", text="x")
                    refused = await post(http, gateway.url, body, accept=json_only, token=attacker)
                    assert refused.status == 406
                answer = await post(http, gateway.url, tool_call("whoami"), token=victim)
                assert answer.status == 200
                assert answer.message["result"]["structuredContent"]["replica"] in ("r1", "r2")
                assert all(healthy(gateway.state).values())
            async with http.get(admin.make_url("/readyz")) as ready:
                assert ready.status == 200
                assert (await ready.json())["backends"]["reports"]["healthy"] == 2
        finally:
            await admin.close()


@pytest.mark.parametrize(
    "accept",
    [
        ("application/json",),
        ("text/event-stream",),
        ("application/json, text/event-stream;q=0",),
        ("text/html",),
        ("",),
    ],
)
async def test_an_accept_that_excludes_json_or_sse_is_406_naming_the_header(
    http: aiohttp.ClientSession, gateway_url: str, accept: tuple[str, ...]
) -> None:
    answer = await post(http, gateway_url, tool_call("echo", text="x"), accept=accept)
    assert answer.status == 406
    assert answer.headers["Content-Type"] == "application/json"
    message = answer.message
    # Refused before the body is read (as a backend refuses it): there is no id to echo.
    assert (message["id"], message["error"]["code"]) == (None, -32600)
    assert message["error"]["message"] == (
        "Not acceptable: the Accept header must admit both application/json and text/event-stream"
    )


@pytest.mark.parametrize(
    "accept",
    [
        None,
        ("*/*",),
        (BOTH,),
        ("text/*, application/*",),
        ("APPLICATION/JSON;q=0.9, Text/Event-Stream; charset=utf-8",),
        ("application/json", "text/event-stream"),  # two lines: one list (RFC 9110 5.3)
    ],
    ids=["no-accept", "any", "both", "wildcards", "case-and-parameters", "two-lines"],
)
async def test_an_accept_that_admits_both_reaches_the_backend(
    http: aiohttp.ClientSession, gateway_url: str, accept: tuple[str, ...] | None
) -> None:
    answer = await post(http, gateway_url, tool_call("echo", text="hi"), accept=accept)
    assert answer.status == 200
    assert answer.message["result"]["structuredContent"] == {"result": "hi"}


async def test_fastmcp_refusing_a_body_in_plain_text_is_relayed_and_blames_no_replica(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess]
) -> None:
    # taskgate allows larger bodies than the backends' 4 MiB here, so FastMCP refuses them
    # itself, with a 413 in plain words: the client's doing, told in the backend's words.
    config = gateway_config(
        {"reports": [b.url for b in report_backends]},
        [(["echo", "whoami"], "reports")],
        listen={"max_body_bytes": 6 * 1024 * 1024},
        health={**QUIET_HEALTH, "unhealthy_after": 1},
    )
    async with serving(config) as gateway:
        await probed(gateway.state)
        body = tool_call("echo", text="x" * (5 * 1024 * 1024))
        headers = mcp_headers("tools/call", body["params"])

        async def sent(url: str) -> tuple[int, str | None, bytes]:
            data = io.BytesIO(orjson.dumps(body))  # aiohttp warns of large bytes
            async with http.post(url, data=data, headers=headers) as answer:
                return answer.status, answer.headers.get("Content-Type"), await answer.read()

        direct = await sent(report_backends[0].url)
        assert direct[0] == 413
        assert direct[2] == b"Request body too large"
        for _ in range(4):
            assert await sent(gateway.url) == direct
        assert all(healthy(gateway.state).values())
        served = await post(http, gateway.url, tool_call("whoami"))
        assert served.status == 200


# -- answers FastMCP does not give on demand, from a raw upstream -------------------------------

RELEASE = web.AppKey("release", asyncio.Event)
TOOLS = [{"name": name, "inputSchema": {"type": "object"}} for name in ("refuse", "fail", "hang")]
TOOLS += [{"name": name, "inputSchema": {"type": "object"}} for name in ("make_task", "ok")]


def raw_upstream() -> web.Application:
    """An MCP upstream whose tools answer as told: `refuse` with any status, body and headers,
    `fail` with a 500 (JSON-RPC or text), `hang` never (until released); tasks/get hangs."""
    app = web.Application()
    app[RELEASE] = asyncio.Event()
    app.router.add_post("/mcp", _answer)
    return app


def _json(request_id: Any, result: dict[str, Any]) -> web.Response:
    return web.json_response({"jsonrpc": "2.0", "id": request_id, "result": result})


async def _answer(request: web.Request) -> web.Response:
    message = orjson.loads(await request.read())
    method, request_id = message["method"], message.get("id")
    if method == "server/discover":
        capabilities: dict[str, Any] = {
            "tools": {},
            "extensions": {"io.modelcontextprotocol/tasks": {}},
        }
        discovered = {
            "resultType": "complete",
            "supportedVersions": ["2026-07-28"],
            "capabilities": capabilities,
            "ttlMs": 0,
            "cacheScope": "public",
        }
        return _json(request_id, discovered)
    if method == "tools/list":
        return _json(request_id, {"resultType": "complete", "tools": TOOLS})
    if method == "tasks/get":
        await request.app[RELEASE].wait()
        return _json(request_id, {"resultType": "complete", **_task(message["params"]["taskId"])})
    name, arguments = message["params"]["name"], message["params"].get("arguments") or {}
    if name == "refuse":
        body = arguments.get("body", "").encode()
        return web.Response(status=arguments["status"], body=body, headers=arguments["headers"])
    if name == "fail":
        if arguments.get("json"):
            error = {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32603, "message": "x"}}
            return web.json_response(error, status=500)
        return web.Response(status=500, text="Internal Server Error")
    if name == "hang":
        await request.app[RELEASE].wait()
    if name == "make_task":
        return _json(request_id, {"resultType": "task", **_task(arguments["task_id"])})
    return _json(request_id, {"resultType": "complete", "content": []})


def _task(task_id: str) -> dict[str, Any]:
    stamp = "2026-11-29T00:00:00Z"
    return {
        "taskId": task_id,
        "status": "working",
        "createdAt": stamp,
        "lastUpdatedAt": stamp,
        "ttlMs": 60_000,
    }


@pytest.fixture
async def upstream() -> AsyncIterator[TestServer]:
    server = TestServer(raw_upstream(), host="127.0.0.1")
    await server.start_server()
    try:
        yield server
    finally:
        server.app[RELEASE].set()  # handlers still waiting may finish
        await server.close()


def blame_config(upstream: TestServer, unhealthy_after: int) -> Any:
    return gateway_config(
        {"raw": [str(upstream.make_url("/mcp"))]},
        [(["*"], "raw")],
        backend_options={"raw": {"timeout_s": 0.3, "task_timeout_s": 0.3}},
        health={**QUIET_HEALTH, "unhealthy_after": unhealthy_after},
    )


async def refuse(
    http: aiohttp.ClientSession, gateway: RunningGateway, status: int, **answer: Any
) -> Answer:
    headers: Mapping[str, str] = answer.pop("headers", {})
    return await post(
        http, gateway.url, tool_call("refuse", status=status, headers=headers, **answer)
    )


@pytest.mark.parametrize(
    ("status", "body", "headers"),
    [
        (406, "", {}),  # FastMCP's own: no body, no Content-Type
        (413, "Request body too large", {"Content-Type": "text/plain; charset=utf-8"}),
        (404, "<html>no such path</html>", {"Content-Type": "text/html"}),
        (429, "slow down", {"Content-Type": "text/plain", "Retry-After": "7"}),
        (400, '{"detail": "not JSON-RPC"}', {"Content-Type": "application/problem+json"}),
    ],
)
async def test_a_4xx_that_is_not_json_rpc_is_relayed_as_the_backends_answer_and_never_ejects(
    http: aiohttp.ClientSession,
    upstream: TestServer,
    status: int,
    body: str,
    headers: dict[str, str],
) -> None:
    async with serving(blame_config(upstream, unhealthy_after=1)) as gateway:
        await probed(gateway.state)
        for _ in range(5):
            answer = await refuse(http, gateway, status, body=body, headers=headers)
            assert (answer.status, answer.raw) == (status, body.encode())
            assert answer.headers.get("Content-Type") == headers.get("Content-Type")
            assert answer.headers.get("Retry-After") == headers.get("Retry-After")
        assert all(healthy(gateway.state).values())
        assert (await post(http, gateway.url, tool_call("ok"))).status == 200


async def test_a_4xx_counts_neither_against_a_replica_nor_for_it(
    http: aiohttp.ClientSession, upstream: TestServer
) -> None:
    async with serving(blame_config(upstream, unhealthy_after=3)) as gateway:
        await probed(gateway.state)
        assert (await post(http, gateway.url, tool_call("fail"))).status == 502
        for _ in range(5):  # had these counted as successes, the failures would start again
            assert (await refuse(http, gateway, 406)).status == 406
        assert (await post(http, gateway.url, tool_call("fail"))).status == 502
        assert all(healthy(gateway.state).values())
        assert (await post(http, gateway.url, tool_call("fail"))).status == 502
        assert not any(healthy(gateway.state).values())


@pytest.mark.parametrize(("json", "status"), [(False, 502), (True, 500)])
async def test_a_5xx_counts_against_the_replica(
    http: aiohttp.ClientSession, upstream: TestServer, json: bool, status: int
) -> None:
    async with serving(blame_config(upstream, unhealthy_after=1)) as gateway:
        await probed(gateway.state)
        answer = await post(http, gateway.url, tool_call("fail", json=json))
        assert answer.status == status
        assert answer.message["error"]["code"] == -32603
        assert not any(healthy(gateway.state).values())
        # The only replica is out: new calls get the retryable error at once.
        assert (await post(http, gateway.url, tool_call("ok"))).status == 503


async def test_a_tools_call_past_its_deadline_does_not_count_against_the_replica(
    http: aiohttp.ClientSession, upstream: TestServer
) -> None:
    async with serving(blame_config(upstream, unhealthy_after=1)) as gateway:
        await probed(gateway.state)
        for _ in range(3):  # the tool may just be slow for this input
            answer = await post(http, gateway.url, tool_call("hang"))
            assert answer.status == 504
            assert answer.message["error"]["data"] == {"retryable": False}
        assert all(healthy(gateway.state).values())
        assert (await post(http, gateway.url, tool_call("ok"))).status == 200


async def test_a_tasks_get_past_its_deadline_counts_against_the_replica(
    http: aiohttp.ClientSession, upstream: TestServer
) -> None:
    async with serving(blame_config(upstream, unhealthy_after=1)) as gateway:
        await probed(gateway.state)
        created = await post(http, gateway.url, tool_call("make_task", task_id="t-1"))
        assert created.message["result"]["taskId"] == "t-1"
        assert all(healthy(gateway.state).values())
        get = build_request("tasks/get", {"taskId": "t-1"}, id=next(ids))
        answer = await post(http, gateway.url, get)
        # tasks/get is idempotent: the client may retry it, and a replica that cannot answer
        # one in time is not serving.
        assert answer.status == 503
        assert answer.message["error"]["data"] == {"retryable": True}
        assert not any(healthy(gateway.state).values())
