"""The official TypeScript SDK v2 client (`@modelcontextprotocol/client`, pinned in
tests/clients/ts/package.json) works through taskgate: pinned to 2026-07-28 it connects by
`server/discover`, and what it gets through taskgate is what it gets from the backend direct. On the
wire it sends the routing headers taskgate requires, Mcp-Name included on tools/call, prompts/get,
resources/read and tasks/*, so it passes taskgate's `strict_headers` checks.

tests/clients/ts/client.mjs is the client; `npm ci` installs it when node_modules is missing or
holds another version. Node.js 20 or later is required: without it these tests fail, they do not
skip.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from gateway.protocol.headers import encode_value
from tests.support.gateway import gateway_config, running_gateway
from tests.support.issuer import Issuer, jwt_auth
from tests.support.mcp import (
    META_VERSION,
    PROTOCOL_VERSION,
    JsonObject,
    routing_name,
    wait_for_task_status,
)
from tests.support.node import Finished, NodeProject, prepare_node_project, run_process
from tests.support.procs import REPO_ROOT, BackendProcess
from tests.support.tasks import create_report

TS_DIR = REPO_ROOT / "tests" / "clients" / "ts"
SDK_PACKAGE = "@modelcontextprotocol/client"
CLIENT_TIMEOUT_S = 60.0

REPORT_TEMPLATE = "reports://{tenant}/reports/{id}"
# The backend's whole surface that client.mjs uses, and a few items it does not.
ROUTES: list[tuple[list[str], str] | dict[str, Any]] = [
    {"tools": ["echo", "generate_report"], "backend": "reports"},
    {"prompts": ["report_greeting", "report_summarize"], "backend": "reports"},
    {
        "resources": ["reports://about", "reports://acme/*"],
        "resource_templates": [REPORT_TEMPLATE],
        "backend": "reports",
    },
]
# client.mjs's calls whose results must be the backend's as the SDK got them direct.
RELAYED = ("echo", "prompt", "resource", "templated", "templatedUnicode", "completion")
# What the SDK sends for the steps of client.mjs, in order: (method, Mcp-Name or None).
STEPS = [
    ("server/discover", None),
    ("tools/list", None),
    ("tools/call", "echo"),
    ("prompts/list", None),
    ("prompts/get", "report_summarize"),
    ("resources/list", None),
    ("resources/read", "reports://about"),
    ("resources/templates/list", None),
    ("resources/read", "reports://acme/reports/42"),
    ("resources/read", "reports://acme/reports/caf\u00e9"),  # the =?base64?...?= form
    ("completion/complete", None),
]
SIZES = ("small", "large")  # of the two report tasks: one approved, one cancelled
HOP_BY_HOP = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"}
)


# --- the client ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TsClient:
    """client.mjs ready to run, or why it is not (which fails each test that needs it)."""

    project: NodeProject

    async def finish(self, url: str, *args: str, token: str | None = None) -> Finished:
        """client.mjs against `url` with `args`, run to its end."""
        argv = [self.project.require(), "client.mjs", url, *args]
        if token is not None:
            argv += ["--token", token]
        return await run_process(argv, cwd=TS_DIR, limit_s=CLIENT_TIMEOUT_S)

    async def run(self, url: str, *args: str, token: str | None = None) -> JsonObject:
        """The JSON object client.mjs printed against `url`; the test fails if it failed."""
        finished = await self.finish(url, *args, token=token)
        if not finished.ok:
            pytest.fail(f"client.mjs failed: {finished.describe()}", pytrace=False)
        try:
            out: JsonObject = json.loads(finished.stdout)
        except json.JSONDecodeError:
            pytest.fail(f"client.mjs printed no JSON object: {finished.describe()}", pytrace=False)
        return out


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def ts_client() -> TsClient:
    """Node checked and the pinned SDK installed, once for the module. A problem is not raised
    here, where it would be a setup error: each test that runs the client fails with it."""
    return TsClient(await prepare_node_project(TS_DIR, [SDK_PACKAGE]))


# --- a recording proxy ---------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One HTTP request the client sent, as it arrived, and the status it got."""

    http_method: str
    headers: CIMultiDict[str]
    body: Any
    status: int

    @property
    def method(self) -> str | None:
        return self.body.get("method") if isinstance(self.body, dict) else None

    @property
    def params(self) -> JsonObject:
        params = self.body.get("params") if isinstance(self.body, dict) else None
        return params if isinstance(params, dict) else {}


@asynccontextmanager
async def recording_proxy(upstream: str) -> AsyncIterator[tuple[str, list[Seen]]]:
    """A loopback URL that forwards every request to `upstream` as it came (headers included,
    bar hop-by-hop ones) and the answer back as it came; and the list of what it saw."""
    seen: list[Seen] = []
    async with aiohttp.ClientSession(auto_decompress=False) as session:

        async def forward(request: web.Request) -> web.Response:
            body = await request.read()
            headers = CIMultiDict(
                (k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP
            )
            async with session.request(
                request.method, upstream, data=body, headers=headers, allow_redirects=False
            ) as answer:
                payload = await answer.read()
                status = answer.status
                back = CIMultiDict(
                    (k, v) for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP
                )
            parsed = orjson.loads(body) if body else None
            seen.append(Seen(request.method, CIMultiDict(request.headers), parsed, status))
            return web.Response(status=status, body=payload, headers=back)

        app = web.Application()
        app.router.add_route("*", "/mcp", forward)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            yield str(server.make_url("/mcp")), seen
        finally:
            await server.close()


def media_types(accept: str) -> set[str]:
    return {part.split(";")[0].strip().lower() for part in accept.split(",")}


# --- tests ---------------------------------------------------------------------------------


async def test_the_ts_sdk_client_speaks_2026_07_28_through_taskgate_and_gets_what_it_gets_direct(
    ts_client: TsClient, issuer: Issuer, r1: BackendProcess
) -> None:
    config = gateway_config({"reports": [r1.url]}, ROUTES, auth=jwt_auth(issuer))
    async with running_gateway(config) as url:
        via = await ts_client.run(url, token=issuer.token())
    direct = await ts_client.run(r1.url)

    # Pinned, the SDK probes with server/discover, which taskgate answers itself.
    for out in (via, direct):
        assert out["connected"]["protocolEra"] == "modern"
        assert out["connected"]["protocolVersion"] == PROTOCOL_VERSION
        assert out["connected"]["discover"]["supportedVersions"] == [PROTOCOL_VERSION]
    assert via["connected"]["serverVersion"]["name"] == "taskgate"
    assert direct["connected"]["serverVersion"]["name"] == "report"

    # Every call is the backend's answer, as the SDK returned it direct.
    for step in RELAYED:
        assert via[step] == direct[step], step
    assert via["echo"]["structuredContent"] == {"result": "via the ts sdk"}
    assert via["prompt"]["messages"] == [
        {
            "role": "user",
            "content": {
                "type": "text",
                "text": "Summarize acme's reports for the last week (replica r1).",
            },
        }
    ]
    assert via["resource"]["contents"] == [
        {
            "uri": "reports://about",
            "mimeType": "text/plain",
            "text": "The report backend, replica r1.",
        }
    ]
    (templated,) = via["templated"]["contents"]
    assert json.loads(templated["text"]) == {"tenant": "acme", "id": "42", "replica": "r1"}
    (unicode,) = via["templatedUnicode"]["contents"]
    assert json.loads(unicode["text"])["id"] == "caf\u00e9"
    assert via["completion"]["completion"]["values"] == ["acme"]

    # Each list is the routed part of the backend's, each item as the backend lists it.
    lists = {
        "toolsList": ("tools", "name", ["echo", "generate_report"]),
        "promptsList": ("prompts", "name", ["report_greeting", "report_summarize"]),
        "resourcesList": ("resources", "uri", ["reports://about", "reports://acme/summary"]),
        "templatesList": ("resourceTemplates", "uriTemplate", [REPORT_TEMPLATE]),
    }
    for step, (field, key, routed) in lists.items():
        items = via[step][field]
        assert [item[key] for item in items] == routed, step
        backend = {item[key]: item for item in direct[step][field]}
        assert items == [backend[name] for name in routed], step


async def test_the_ts_sdk_client_sends_mcp_name_and_passes_strict_headers_with_tasks(
    ts_client: TsClient, http: aiohttp.ClientSession, r1: BackendProcess
) -> None:
    config = gateway_config({"reports": [r1.url]}, ROUTES, listen={"strict_headers": True})
    async with running_gateway(config) as url, recording_proxy(url) as (proxy, seen):
        approve, cancel = [str((await create_report(http, url, s))["taskId"]) for s in SIZES]
        for task_id in (approve, cancel):
            await wait_for_task_status(http, url, task_id, {"input_required"})
        out = await ts_client.run(
            proxy, "--approve-task", approve, "--cancel-task", cancel, "--try-generate-report"
        )
        done = await wait_for_task_status(http, url, approve, {"completed"})
        cancelled = await wait_for_task_status(http, url, cancel, {"cancelled"})

    # What the SDK sent, in order: the steps of client.mjs, then the Tasks extension's methods
    # with the task id as Mcp-Name, then a task tool's tools/call. Only POSTs: no GET stream, no
    # DELETE, no notification.
    assert [(s.method, routing_name(s.method or "", s.params)) for s in seen] == [
        *STEPS,
        ("tasks/get", approve),
        ("tasks/update", approve),
        ("tasks/cancel", cancel),
        ("tools/call", "generate_report"),
    ]
    for request in seen:
        headers = request.headers
        assert request.http_method == "POST", request
        assert request.status == 200, request
        assert "id" in request.body, request
        assert request.params["_meta"][META_VERSION] == PROTOCOL_VERSION
        assert headers.getall("MCP-Protocol-Version") == [PROTOCOL_VERSION]
        assert headers.getall("Mcp-Method") == [request.method]
        name = routing_name(request.method or "", request.params)
        assert headers.getall("Mcp-Name", []) == ([] if name is None else [encode_value(name)])
        assert media_types(headers["Accept"]) == {"application/json", "text/event-stream"}
        assert headers["Content-Type"] == "application/json"
    (unicode_read,) = (s for s in seen if s.params.get("uri") == "reports://acme/reports/caf\u00e9")
    assert unicode_read.headers["Mcp-Name"].startswith("=?base64?")

    # The tasks/* calls worked: the approval finished the task, the cancel cancelled the other.
    assert out["taskGet"]["taskId"] == approve
    assert out["taskGet"]["status"] == "input_required"
    assert done["result"]["structuredContent"] == {
        "size": SIZES[0],
        "approved": True,
        "replica": "r1",
    }
    assert cancelled["status"] == "cancelled"
    # SDK 2.4.0 has no client side for the Tasks extension: taskgate relays the task it created
    # (200 above), and the SDK refuses the result it cannot consume.
    assert out["generateReport"]["error"]["code"] == "UNSUPPORTED_RESULT_TYPE"
    assert out["generateReport"]["error"]["data"] == {"resultType": "task", "method": "tools/call"}


async def test_in_auto_mode_the_ts_sdk_client_upgrades_and_its_default_2025_handshake_is_served(
    ts_client: TsClient, r1: BackendProcess
) -> None:
    async with running_gateway(gateway_config({"reports": [r1.url]}, ROUTES)) as url:
        auto = await ts_client.run(url, "--negotiation", "auto")
        legacy = await ts_client.run(url, "--negotiation", "legacy")
    off = gateway_config({"reports": [r1.url]}, ROUTES, legacy={"enabled": False})
    async with running_gateway(off) as url:
        refused = await ts_client.finish(url, "--negotiation", "legacy")
    legacy_direct = await ts_client.run(r1.url, "--negotiation", "legacy")

    # 'auto' probes with server/discover; taskgate's answer is definitely modern.
    assert auto["connected"]["protocolEra"] == "modern"
    assert auto["connected"]["protocolVersion"] == PROTOCOL_VERSION
    assert auto["echo"]["structuredContent"] == {"result": "via the ts sdk"}
    # The SDK's default, 'legacy', sends a 2025 `initialize`: taskgate's 2025-era front door
    # answers it as the backend does direct, and the call goes through (gateway/legacy).
    assert legacy["connected"]["protocolEra"] == "legacy"
    assert legacy["connected"]["protocolVersion"] == "2025-11-25"
    assert legacy["echo"]["structuredContent"] == legacy_direct["echo"]["structuredContent"]
    assert legacy_direct["connected"]["protocolEra"] == "legacy"
    assert legacy_direct["connected"]["protocolVersion"] == "2025-11-25"
    # With legacy.enabled off, the handshake is refused with a 400 naming the revision.
    assert (refused.returncode, refused.timed_out) == (1, False), refused.describe()
    assert '"status":400' in refused.stderr, refused.describe()
