"""Real clients of the 2025 era through taskgate's legacy front door: the official TypeScript SDK
v1 (`@modelcontextprotocol/sdk`) and the MCP Inspector's CLI in its default (legacy) mode, both
pinned in tests/clients/ts1/package.json.

They open with `initialize`, hold the Mcp-Session-Id taskgate hands out, open a GET stream and
(the SDK) end with DELETE. Here each client talks to TWO taskgate instances that share one store,
through a proxy that sends each request to the next instance in turn: every session outlives the
instance that opened it. Two backends (`reports`, `billing`), each a report replica that keeps
2025-era sessions and serves `ask` (backends/report.py --asking), so that a call reaches each
backend and a backend's elicitation reaches the client on a tools/call's SSE stream, its answer
coming back by another POST, to the other instance.

The sanity tests run the same clients against a backend direct, so that a harness failure is told
apart from a taskgate failure: when only the through-taskgate tests fail, taskgate is at fault.

tests/clients/ts1/legacy_client.mjs is the SDK client; `npm ci` installs both packages when
node_modules is missing or holds other versions. Node.js 20 or later is required: without it
these tests fail, they do not skip.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_asyncio

from tests.support.gateway import gateway_config, running_gateway
from tests.support.issuer import Issuer, jwt_auth
from tests.support.mcp import JsonObject
from tests.support.node import Finished, NodeProject, prepare_node_project, run_process
from tests.support.procs import REPO_ROOT, BackendProcess, stop_all
from tests.support.round_robin import RoundRobin, round_robin

TS1_DIR = REPO_ROOT / "tests" / "clients" / "ts1"
SDK_PACKAGE = "@modelcontextprotocol/sdk"
INSPECTOR_PACKAGE = "@modelcontextprotocol/inspector"
CLIENT_TIMEOUT_S = 60.0

# The revisions a 2025-era client may end up on; SDK 1.32.2 asks for the newest.
LEGACY_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
# 2026-07-28 result fields that have no place in a 2025-era answer.
MODERN_KEYS = frozenset({"resultType", "ttlMs", "cacheScope"})
# What legacy_client.mjs answers every elicitation with.
ANSWER = "yes-from-ts"
REPORTS, BILLING = "reports-1", "billing-1"  # the replica names, which the tools' answers carry
# Distinct tools per backend: echo and ask reach reports, whoami reaches billing.
ROUTES: list[tuple[list[str], str] | dict[str, Any]] = [
    {"tools": ["echo", "ask"], "backend": "reports"},
    {"tools": ["whoami"], "backend": "billing"},
]
ROUTED_TOOLS = {"echo", "ask", "whoami"}
STEPS: list[JsonObject] = [
    {"list": "tools"},
    {"call": "echo", "args": {"text": "hi"}},
    {"call": "whoami", "args": {}},
]
ASK: list[JsonObject] = [{"call": "ask", "args": {"question": "ok?"}}]


# --- the clients ---------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node_project() -> NodeProject:
    """Node checked and both packages installed, once for the module. A problem is not raised
    here, where it would be a setup error: each test that runs a client fails with it."""
    return await prepare_node_project(TS1_DIR, [SDK_PACKAGE, INSPECTOR_PACKAGE])


def described_without(finished: Finished, token: str | None) -> str:
    """A client's run for a failure message, the bearer token on its command line masked."""
    described = finished.describe()
    return described.replace(token, "<token>") if token else described


async def legacy_client(
    project: NodeProject, url: str, token: str | None, steps: Sequence[JsonObject]
) -> tuple[Finished, JsonObject]:
    """legacy_client.mjs run to its end, and the JSON line it printed (the test fails when it
    printed none: that is a harness failure, not a refusal)."""
    argv = [project.require(), "legacy_client.mjs", url, token or "-", json.dumps(list(steps))]
    finished = await run_process(argv, cwd=TS1_DIR, limit_s=CLIENT_TIMEOUT_S)
    try:
        out: JsonObject = json.loads(finished.stdout)
    except json.JSONDecodeError:
        described = described_without(finished, token)
        pytest.fail(f"legacy_client.mjs printed no JSON line: {described}", pytrace=False)
    return finished, out


async def legacy_client_ok(
    project: NodeProject,
    url: str,
    token: str | None,
    steps: Sequence[JsonObject],
    proxy: RoundRobin | None = None,
) -> JsonObject:
    """What legacy_client.mjs printed; the test fails, with the client's error and what went
    through the proxy, unless every step succeeded."""
    finished, out = await legacy_client(project, url, token, steps)
    if not finished.ok or out["error"] is not None:
        seen = "" if proxy is None else f"\nthrough the proxy:\n{exchanges(proxy)}"
        described = described_without(finished, token)
        pytest.fail(
            f"the TS SDK v1 client failed: {out['error']}{seen}\n{described}", pytrace=False
        )
    return out


async def inspector(
    project: NodeProject, url: str, token: str | None, home: Path, *args: str
) -> JsonObject:
    """The Inspector CLI's `result` for one method (`args`), run from node_modules/.bin so that
    nothing is downloaded; the test fails unless it succeeded."""
    argv = [str(project.bin("inspector")), "--cli", url, "--transport", "http"]
    if token is not None:
        argv += ["--header", f"Authorization: Bearer {token}"]
    # json: one object on stdout; --stored-auth-only: a 401 fails at once rather than waiting
    # for an interactive OAuth login.
    argv += ["--format", "json", "--stored-auth-only", *args]
    # The CLI keeps a catalog and client state under ~/.mcp-inspector: a HOME of the test's own.
    env = {**os.environ, "HOME": str(home)}
    finished = await run_process(argv, cwd=TS1_DIR, limit_s=CLIENT_TIMEOUT_S, env=env)
    described = described_without(finished, token)
    if not finished.ok:
        pytest.fail(f"the Inspector CLI failed: {described}", pytrace=False)
    try:
        result: JsonObject = json.loads(finished.stdout)["result"]
    except (json.JSONDecodeError, KeyError, TypeError):
        pytest.fail(f"the Inspector CLI printed no result: {described}", pytrace=False)
    return result


def exchanges(proxy: RoundRobin) -> str:
    """What went through the proxy, one line per request, for a failure message."""
    lines = []
    for seen in proxy.exchanges:
        method = ""
        if seen.body:
            try:
                method = json.loads(seen.body).get("method") or "(a response)"
            except (json.JSONDecodeError, AttributeError):
                method = "(not a JSON object)"
        lines.append(f"  {seen.method} -> instance {seen.upstream}: {seen.status} {method}")
    return "\n".join(lines)


def texts(result: JsonObject) -> list[str]:
    """The text items of a tools/call result."""
    return [item["text"] for item in result["content"] if item["type"] == "text"]


def step_result(out: JsonObject, index: int) -> JsonObject:
    result: JsonObject = out["results"][index]["result"]
    return result


def requests(out: JsonObject, method: str) -> list[JsonObject]:
    """The HTTP requests legacy_client.mjs made with `method` (GET, POST, DELETE)."""
    return [entry for entry in out["http"] if entry["method"] == method]


# --- backends and taskgate -----------------------------------------------------------------


@pytest.fixture(scope="module")
def asking_backends() -> Iterator[dict[str, BackendProcess]]:
    """One replica per backend, each with `ask` and 2025-era sessions; booted together."""
    backends = {
        "reports": BackendProcess(REPORTS, asking=True),
        "billing": BackendProcess(BILLING, asking=True),
    }
    try:
        for backend in backends.values():
            backend.launch()
        for backend in backends.values():
            backend.wait_ready()
        yield backends
    finally:
        stop_all(backends.values())


def origin(url: str) -> str:
    """scheme://host:port of an endpoint URL: the proxy appends the request's path itself."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


@dataclass(frozen=True)
class Front:
    """The proxy in front of the two instances, and taskgate's endpoint through it."""

    proxy: RoundRobin
    url: str

    def spread(self) -> set[int]:
        """The instances that served the requests after the first (initialize)."""
        return {seen.upstream for seen in self.proxy.exchanges[1:]}

    def describe(self) -> str:
        return exchanges(self.proxy)


@pytest.fixture
async def front(
    asking_backends: dict[str, BackendProcess], issuer: Issuer, tmp_path: Path
) -> AsyncIterator[Front]:
    """Two taskgate instances on one SQLite store file (so that each finds the sessions the other
    opened), JWT auth with the test issuer, behind the round-robin proxy."""
    config = gateway_config(
        {name: [backend.url] for name, backend in asking_backends.items()},
        ROUTES,
        store=f"sqlite:///{tmp_path / 'store.db'}",
        auth=jwt_auth(issuer),
    )
    async with AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(running_gateway(config)) for _ in range(2)]
        path = urlsplit(urls[0]).path
        assert all(urlsplit(url).path == path for url in urls)
        proxy = await stack.enter_async_context(round_robin([origin(url) for url in urls]))
        yield Front(proxy, proxy.url_for(path))


# --- sanity: the harness against a backend direct ------------------------------------------


async def test_the_ts_sdk_v1_client_against_a_backend_direct(
    node_project: NodeProject, asking_backends: dict[str, BackendProcess]
) -> None:
    reports, billing = asking_backends["reports"], asking_backends["billing"]
    out = await legacy_client_ok(node_project, reports.url, None, [*STEPS, *ASK])
    whoami = await legacy_client_ok(node_project, billing.url, None, STEPS[2:])

    assert out["protocolVersion"] == "2025-11-25"
    assert out["sessionId"]
    assert out["serverInfo"]["name"] == "report"
    listed = out["results"][0]["wire"]
    assert {tool["name"] for tool in listed["tools"]} >= ROUTED_TOOLS
    assert texts(step_result(out, 1)) == ["hi"]
    assert texts(step_result(out, 3)) == [f"{REPORTS}:accept:{ANSWER}"]
    assert [e["message"] for e in out["elicitations"]] == ["ok?"]
    assert [json.loads(text) for text in texts(step_result(whoami, 0))] == [{"replica": BILLING}]

    # The client's wire, which the front door has to serve: initialize without a session or
    # protocol header, then every request with both; a GET stream opened as soon as
    # notifications/initialized is accepted; the elicitation answered by a POST of its own;
    # DELETE at the end.
    (first, *rest) = out["http"]
    assert first["jsonrpc"] == {"method": "initialize", "id": 0}
    assert "mcp-session-id" not in first["headers"]
    assert "mcp-protocol-version" not in first["headers"]
    for entry in rest:
        assert entry["headers"]["mcp-session-id"] == out["sessionId"], entry
        assert entry["headers"]["mcp-protocol-version"] == out["protocolVersion"], entry
    assert rest[0]["jsonrpc"] == {"method": "notifications/initialized"}
    assert rest[0]["status"] == 202
    (get,) = requests(out, "GET")
    assert (get["status"], get["contentType"]) == (200, "text/event-stream")
    answers = [e for e in requests(out, "POST") if "result" in (e.get("jsonrpc") or {})]
    assert [a["status"] for a in answers] == [202]
    assert out["deleteStatus"] == 200
    assert out["transportErrors"] == []


async def test_the_inspector_cli_against_a_backend_direct(
    node_project: NodeProject, asking_backends: dict[str, BackendProcess], tmp_path: Path
) -> None:
    reports = asking_backends["reports"]
    # A one-upstream proxy, to see the headers the CLI sends (a token the backend ignores).
    async with round_robin([origin(reports.url)]) as proxy:
        url = proxy.url_for(urlsplit(reports.url).path)
        listed = await inspector(node_project, url, "t0ken", tmp_path, "--method", "tools/list")
        called = await inspector(
            node_project,
            url,
            "t0ken",
            tmp_path,
            *("--method", "tools/call", "--tool-name", "echo", "--tool-arg", "text=hi"),
        )

    assert {tool["name"] for tool in listed["tools"]} >= ROUTED_TOOLS
    assert texts(called) == ["hi"]
    # --header reaches every request, the GET stream's included; the CLI's default is the 2025
    # handshake.
    assert all(seen.headers.get("Authorization") == "Bearer t0ken" for seen in proxy.exchanges)
    initialize = json.loads(proxy.exchanges[0].body)
    assert initialize["method"] == "initialize"
    assert initialize["params"]["protocolVersion"] in LEGACY_VERSIONS


# --- through two taskgate instances ----------------------------------------------------------


async def test_the_ts_sdk_v1_client_lists_and_calls_each_backend_through_two_instances(
    node_project: NodeProject,
    asking_backends: dict[str, BackendProcess],
    front: Front,
    issuer: Issuer,
) -> None:
    via = await legacy_client_ok(node_project, front.url, issuer.token(), STEPS, front.proxy)
    direct_reports = await legacy_client_ok(
        node_project, asking_backends["reports"].url, None, [STEPS[1]]
    )
    direct_billing = await legacy_client_ok(
        node_project, asking_backends["billing"].url, None, [STEPS[2]]
    )

    assert via["protocolVersion"] in LEGACY_VERSIONS
    assert via["sessionId"]
    # The session's requests went to both instances: each found the session in the store.
    assert front.spread() == {0, 1}, front.describe()

    # The list is the routed tools, in the shape of the 2025 era: as the SDK parsed it and as it
    # came on the wire (the SDK's schemas drop keys they do not know).
    listed, wire = via["results"][0]["result"], via["results"][0]["wire"]
    assert {tool["name"] for tool in listed["tools"]} == ROUTED_TOOLS
    assert {tool["name"] for tool in wire["tools"]} == ROUTED_TOOLS
    assert MODERN_KEYS.isdisjoint(wire), wire
    for tool in wire["tools"]:
        assert MODERN_KEYS.isdisjoint(tool), tool

    # Each call reached its backend and came back as the backend gives it.
    for via_result, direct in (
        (step_result(via, 1), direct_reports),
        (step_result(via, 2), direct_billing),
    ):
        direct_result = step_result(direct, 0)
        assert texts(via_result) == texts(direct_result)
        assert via_result.get("structuredContent") == direct_result.get("structuredContent")
    assert texts(step_result(via, 1)) == ["hi"]
    assert [json.loads(text) for text in texts(step_result(via, 2))] == [{"replica": BILLING}]

    # The GET stream and DELETE of the 2025 era are served.
    assert [(g["status"], g["contentType"]) for g in requests(via, "GET")] == [
        (200, "text/event-stream")
    ]
    assert 200 <= via["deleteStatus"] < 300
    assert via["transportErrors"] == []


async def test_the_ts_sdk_v1_client_answers_a_backend_elicitation_through_two_instances(
    node_project: NodeProject, front: Front, issuer: Issuer
) -> None:
    # Twice: the SDK opens its GET stream in the background, so the first call's place in the
    # proxy's turn is not fixed; the second call and its answer arrive one after the other,
    # with nothing in between, so they reach different instances.
    via = await legacy_client_ok(node_project, front.url, issuer.token(), ASK * 2, front.proxy)

    # elicitation/create came on the tools/call's SSE stream from one instance; the client's
    # answer, a POST of its own, went to the other, which passed it to the backend session that
    # waits for it.
    assert [e["message"] for e in via["elicitations"]] == ["ok?", "ok?"]
    for index in (0, 1):
        assert texts(step_result(via, index)) == [f"{REPORTS}:accept:{ANSWER}"]
    seen = front.proxy.exchanges
    calls = [n for n, e in enumerate(seen) if b'"tools/call"' in e.body]
    answers = [n for n, e in enumerate(seen) if b'"result"' in e.body]
    assert len(calls) == len(answers) == 2, front.describe()
    assert answers[1] == calls[1] + 1, front.describe()
    assert seen[calls[1]].upstream != seen[answers[1]].upstream, front.describe()
    assert all(seen[n].status == 202 for n in answers), front.describe()


async def test_the_inspector_cli_lists_and_calls_through_two_instances(
    node_project: NodeProject, front: Front, issuer: Issuer, tmp_path: Path
) -> None:
    url, token = front.url, issuer.token()
    listed = await inspector(node_project, url, token, tmp_path, "--method", "tools/list")
    called = await inspector(
        node_project,
        url,
        token,
        tmp_path,
        *("--method", "tools/call", "--tool-name", "echo", "--tool-arg", "text=hi"),
    )

    assert {tool["name"] for tool in listed["tools"]} == ROUTED_TOOLS
    for tool in listed["tools"]:
        assert MODERN_KEYS.isdisjoint(tool), tool
    assert texts(called) == ["hi"]
    assert front.spread() == {0, 1}, front.describe()


async def test_without_a_token_the_legacy_handshake_is_refused_with_401(
    node_project: NodeProject, front: Front
) -> None:
    finished, out = await legacy_client(node_project, front.url, None, STEPS)

    assert finished.returncode == 1, described_without(finished, None)
    assert out["error"]["code"] == 401, out["error"]
    assert out["sessionId"] is None
    assert [(e["method"], e["status"]) for e in out["http"]] == [("POST", 401)]
