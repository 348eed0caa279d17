"""2026-07-28 clients through taskgate to a server of the 2025 era: the Python SDK 1.x (FastMCP
over Streamable HTTP, stateful and stateless), which answers no 2026-07-28 request itself.
taskgate learns its era, reads its lists over a session of its own, and sends each caller's
calls in a session of that caller's, answering in the 2026-07-28 shapes."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import aiohttp
import pytest

from gateway.bridge.era import MODERN
from tests.support.era2025 import PySDK1Process
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth, running_issuer
from tests.support.mcp import build_request, mcp_exchange, mcp_headers, poll_until

ROUTES: list[tuple[list[str], str] | dict[str, Any]] = [
    {
        "tools": ["*"],
        "prompts": ["*"],
        "resources": ["note://*"],
        "resource_templates": ["note://by/{topic}"],
        "backend": "old",
    }
]
_ids = itertools.count(1)
T = TypeVar("T")


def start(name: str, *, stateless: bool = False) -> PySDK1Process:
    return PySDK1Process(name, stateless=stateless).start()


@pytest.fixture(params=["stateful", "stateless"])
def sdk1(request: pytest.FixtureRequest) -> Iterator[PySDK1Process]:
    server = start("sdk1", stateless=request.param == "stateless")
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def stateful() -> Iterator[PySDK1Process]:
    server = start("sdk1")
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
async def issuer() -> AsyncIterator[Issuer]:
    async with running_issuer("ES256") as running:
        yield running


@pytest.fixture
async def gateway(sdk1: PySDK1Process) -> AsyncIterator[RunningGateway]:
    async with serving(gateway_config({"old": [sdk1.url]}, ROUTES)) as running:
        yield running


async def exchange(
    url: str, method: str, params: dict[str, Any], *, token: str | None = None
) -> list[dict[str, Any]]:
    """Every message of the answer (JSON, or each event of a stream), after a 200."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http:
        status, messages = await mcp_exchange(
            http, url, method, params, id=next(_ids), headers=headers
        )
    assert status == 200, messages
    return messages


async def call(
    url: str, method: str, params: dict[str, Any], *, token: str | None = None
) -> dict[str, Any]:
    """The result of one request."""
    messages = await exchange(url, method, params, token=token)
    answer = messages[-1]
    assert "result" in answer, messages
    result: dict[str, Any] = answer["result"]
    return result


def text(result: dict[str, Any]) -> str:
    value: str = result["content"][0]["text"]
    return value


async def test_its_lists_are_read_over_a_session_of_taskgates(gateway: RunningGateway) -> None:
    tools = await call(gateway.url, "tools/list", {})
    assert {t["name"] for t in tools["tools"]} >= {"add", "whoami", "count", "confirm"}
    assert (tools["resultType"], tools["cacheScope"]) == ("complete", "private")
    prompts = await call(gateway.url, "prompts/list", {})
    assert [p["name"] for p in prompts["prompts"]] == ["greet"]
    resources = await call(gateway.url, "resources/list", {})
    assert [r["uri"] for r in resources["resources"]] == ["note://readme"]
    templates = await call(gateway.url, "resources/templates/list", {})
    assert [t["uriTemplate"] for t in templates["resourceTemplates"]] == ["note://by/{topic}"]
    # What taskgate says it serves comes from the server's initialize result.
    discover = await call(gateway.url, "server/discover", {})
    assert {"tools", "prompts", "resources", "completions"} <= discover["capabilities"].keys()
    (replica,) = gateway.state.backends["old"].replicas
    assert gateway.state.catalog.eras.era_of(replica) == "2025-11-25"


async def test_calls_are_answered_in_the_2026_shapes(gateway: RunningGateway) -> None:
    added = await call(gateway.url, "tools/call", {"name": "add", "arguments": {"a": 2, "b": 3}})
    assert (added["resultType"], text(added), added["isError"]) == ("complete", "5", False)
    prompt = await call(gateway.url, "prompts/get", {"name": "greet", "arguments": {"who": "x"}})
    assert prompt["resultType"] == "complete"
    assert prompt["messages"][0]["content"]["text"] == "Hello, x!"
    read = await call(gateway.url, "resources/read", {"uri": "note://readme"})
    assert (read["resultType"], read["ttlMs"], read["cacheScope"]) == ("complete", 0, "private")
    assert read["contents"][0]["text"] == "a note"
    templated = await call(gateway.url, "resources/read", {"uri": "note://by/owls"})
    assert templated["contents"][0]["text"] == "a note on owls"
    ref = {"type": "ref/resource", "uri": "note://by/{topic}"}
    completed = await call(
        gateway.url,
        "completion/complete",
        {"ref": ref, "argument": {"name": "topic", "value": "al"}},
    )
    assert completed["completion"]["values"] == ["alpha", "albatross"]


async def test_progress_is_relayed_as_it_comes_and_the_result_last(
    gateway: RunningGateway,
) -> None:
    params = {"name": "count", "arguments": {"to": 3}, "_meta": {"progressToken": "p-1"}}
    messages = await exchange(gateway.url, "tools/call", params)
    progress = [m["params"] for m in messages if m.get("method") == "notifications/progress"]
    assert [(p["progressToken"], p["progress"], p["total"]) for p in progress] == [
        ("p-1", 1, 3),
        ("p-1", 2, 3),
        ("p-1", 3, 3),
    ]
    assert text(messages[-1]["result"]) == "counted to 3"
    # Nothing else of the session reached the client: no request, no other notification.
    assert all(m.get("method") in (None, "notifications/progress") for m in messages)


async def test_a_question_the_client_cannot_be_asked_ends_the_call_not_hangs_it(
    gateway: RunningGateway, sdk1: PySDK1Process
) -> None:
    params = {"name": "confirm", "arguments": {"question": "?"}}
    answer = (await exchange(gateway.url, "tools/call", params))[-1]
    if sdk1.stateless:  # no session to answer it in: the call ends with taskgate's error
        assert "a stateless 2025-era server cannot take an answer" in answer["error"]["message"]
        return
    # Told that taskgate cannot put elicitation/create to the client, the server's tool failed.
    assert answer["result"]["isError"] is True
    assert "cannot put elicitation/create" in text(answer["result"])


async def test_each_caller_has_a_session_of_its_own(
    stateful: PySDK1Process, issuer: Issuer
) -> None:
    config = gateway_config({"old": [stateful.url]}, ROUTES, auth=jwt_auth(issuer))
    alice, bob = issuer.token("acme", "alice"), issuer.token("acme", "bob")
    globex_alice = issuer.token("globex", "alice")
    async with serving(config) as gateway:

        async def marker(token: str) -> str:
            return text(
                await call(gateway.url, "tools/call", {"name": "session_marker"}, token=token)
            )

        first = await marker(alice)
        assert await marker(alice) == first  # reused
        assert len({first, await marker(bob), await marker(globex_alice)}) == 3
        # A caller declaring other capabilities is another session too: what a 2025 server
        # registers may depend on them.
        params = {
            "name": "session_marker",
            "_meta": {"io.modelcontextprotocol/clientCapabilities": {"roots": {}}},
        }
        assert text(await call(gateway.url, "tools/call", params, token=alice)) != first
        assert gateway.state.callers.count(gateway.state.backends["old"].replicas[0]) == 4


async def test_past_the_limit_the_least_recently_used_session_ends(
    stateful: PySDK1Process, issuer: Issuer
) -> None:
    config = gateway_config(
        {"old": [stateful.url]},
        ROUTES,
        auth=jwt_auth(issuer),
        backend_options={"old": {"sessions": {"max_per_replica": 1}}},
    )
    alice, bob = issuer.token("acme", "alice"), issuer.token("acme", "bob")
    async with serving(config) as gateway:
        replica = gateway.state.backends["old"].replicas[0]

        async def marker(token: str) -> str:
            return text(
                await call(gateway.url, "tools/call", {"name": "session_marker"}, token=token)
            )

        first = await marker(alice)
        await marker(bob)  # alice's session is the least recently used: it ends
        assert gateway.state.callers.count(replica) == 1
        assert await marker(alice) != first


async def test_a_restarted_replica_gets_new_sessions_without_an_error(
    stateful: PySDK1Process,
) -> None:
    async with serving(gateway_config({"old": [stateful.url]}, ROUTES)) as gateway:
        add = {"name": "add", "arguments": {"a": 1, "b": 1}}
        assert text(await call(gateway.url, "tools/call", add)) == "2"
        stateful.restart()  # the same port; every session it knew is gone
        assert text(await call(gateway.url, "tools/call", add)) == "2"
        # taskgate's own session is opened again too, at the next refresh.
        catalog = gateway.state.catalog
        views = await catalog.views()
        assert "add" in views["old"].tools


async def test_a_client_that_leaves_cancels_the_call_upstream(
    stateful: PySDK1Process,
) -> None:
    async with serving(gateway_config({"old": [stateful.url]}, ROUTES)) as gateway:
        params = {"name": "wait", "arguments": {"seconds": 60, "mark": "left-1"}}
        body = build_request("tools/call", params, id=next(_ids))
        async with aiohttp.ClientSession() as http:

            async def read_the_answer() -> None:
                headers = mcp_headers("tools/call", params)
                async with http.post(gateway.url, json=body, headers=headers) as answer:
                    await answer.read()

            sent = asyncio.ensure_future(read_the_answer())
            # Leave once the server runs the call (in the 2025 era a disconnect is no cancel):
            # the answer read half way is dropped, and its connection with it.
            await poll_until(_now(stateful.noted), lambda noted: "started left-1" in noted)
            sent.cancel()
            await asyncio.gather(sent, return_exceptions=True)
        noted = await poll_until(_now(stateful.noted), lambda noted: len(noted) == 2)
        assert noted == ["started left-1", "cancelled left-1"]


def _now(read: Callable[[], T]) -> Callable[[], Awaitable[T]]:
    """`read` as the probe poll_until awaits."""

    async def probe() -> T:
        return read()

    return probe


async def test_the_prober_keeps_a_2025_replica_healthy(gateway: RunningGateway) -> None:
    state = gateway.state
    replica = state.backends["old"].replicas[0]
    for _ in range(state.config.health.unhealthy_after + 1):
        await state.prober.probe_all()
    assert state.health.healthy(replica)


async def test_a_backend_configured_as_modern_is_not_spoken_to_in_2025(
    sdk1: PySDK1Process,
) -> None:
    config = gateway_config({"old": [sdk1.url]}, ROUTES, backend_options={"old": {"era": MODERN}})
    async with serving(config) as gateway:
        async with aiohttp.ClientSession() as http:
            status, messages = await mcp_exchange(http, gateway.url, "tools/list", {}, id=1)
        assert messages[-1]["error"]["message"].startswith("No backend answered discovery")
        assert gateway.state.catalog.eras.era_of(gateway.state.backends["old"].replicas[0]) is None
        del status
