"""2026-07-28 clients through taskgate to servers of the 2025 era: the Python SDK 1.x (FastMCP
over Streamable HTTP) and the TypeScript SDK 1.x, each stateful and stateless, which answer no
2026-07-28 request themselves. taskgate learns their era, reads their lists over a session of
its own, and sends each caller's calls in a session of that caller's, answering in the
2026-07-28 shapes; 2025-era clients reach them through the front door."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import fastmcp
import mcp
import pytest

from gateway.bridge.era import MODERN
from gateway.ops.inspect import discovered
from tests.support.era2025 import (
    ROUTES,
    Era2025Process,
    TSSDK1Process,
    call,
    exchange,
    started,
    text,
)
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.legacy import LegacyClient
from tests.support.mcp import build_request, mcp_exchange, mcp_headers, poll_until
from tests.support.node import NodeProject

_ids = itertools.count(1)
T = TypeVar("T")


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
    assert (added["resultType"], text(added)) == ("complete", "5")
    assert added.get("isError", False) is False  # the TypeScript SDK leaves a false one out
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
    gateway: RunningGateway, sdk1: Era2025Process
) -> None:
    # A client that may be asked (it declares sampling), but not what the server asks.
    declared: dict[str, Any] = {"io.modelcontextprotocol/clientCapabilities": {"sampling": {}}}
    params = {"name": "confirm", "arguments": {"question": "?"}, "_meta": declared}
    answer = (await exchange(gateway.url, "tools/call", params))[-1]
    if sdk1.name.startswith("ts-"):
        # It asks nothing: the TypeScript SDK checks what the client declared.
        assert "does not support" in text(answer["result"])
    elif sdk1.stateless:  # it asks, with no session to answer in: taskgate ends the call
        assert "a stateless 2025-era server cannot take an answer" in answer["error"]["message"]
    else:  # told that taskgate cannot put elicitation/create to the client, its tool failed
        assert answer["result"]["isError"] is True
        assert "cannot put elicitation/create" in text(answer["result"])


async def test_each_caller_has_a_session_of_its_own(
    stateful: Era2025Process, issuer: Issuer
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
    stateful: Era2025Process, issuer: Issuer
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
    stateful: Era2025Process,
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
    stateful: Era2025Process,
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
    await state.catalog.views()  # its era learned, as the first look at start learns it
    for _ in range(state.config.health.unhealthy_after + 1):
        await state.prober.probe_all()
    assert state.health.healthy(replica)


async def test_a_backend_configured_as_modern_is_not_spoken_to_in_2025(
    sdk1: Era2025Process,
) -> None:
    config = gateway_config({"old": [sdk1.url]}, ROUTES, backend_options={"old": {"era": MODERN}})
    async with serving(config) as gateway:
        async with aiohttp.ClientSession() as http:
            status, messages = await mcp_exchange(http, gateway.url, "tools/list", {}, id=1)
        assert messages[-1]["error"]["message"].startswith("No backend answered discovery")
        assert gateway.state.catalog.eras.era_of(gateway.state.backends["old"].replicas[0]) is None
        del status


async def test_a_2025_client_reaches_it_through_the_front_door(gateway: RunningGateway) -> None:
    async with aiohttp.ClientSession() as http:
        client = LegacyClient(http, gateway.url)
        opened = await client.initialize()
        assert opened.status == 200
        assert "tools" in opened.result["capabilities"]
        listed = await client.request("tools/list")
        assert "add" in {t["name"] for t in listed.result["tools"]}
        added = await client.request("tools/call", {"name": "add", "arguments": {"a": 4, "b": 5}})
        assert text(added.result) == "9"
        assert "resultType" not in added.result  # in the client's own era's shape
        assert await client.delete() == 200


async def test_an_idle_session_ends_and_the_next_call_opens_another(
    stateful: Era2025Process,
) -> None:
    config = gateway_config(
        {"old": [stateful.url]}, ROUTES, backend_options={"old": {"sessions": {"idle_s": 60}}}
    )
    async with serving(config) as gateway:
        first = text(await call(gateway.url, "tools/call", {"name": "session_marker"}))
        # The time under test, passed without waiting it out: the session last used 61 s ago.
        (table,) = gateway.state.callers._tables.values()
        for held in table.held.values():
            held.used_at -= 61
        assert text(await call(gateway.url, "tools/call", {"name": "session_marker"})) != first
        assert gateway.state.callers.count(gateway.state.backends["old"].replicas[0]) == 1


async def test_check_discover_says_what_each_replica_speaks(sdk1: Era2025Process) -> None:
    config = gateway_config({"old": [sdk1.url]}, ROUTES)
    found = await discovered(config)
    assert found.silent == []
    (line,) = found.eras
    assert line.split()[:3] == ["old", urlsplit(sdk1.url).netloc, "2025-11-25"]


async def test_a_new_callers_call_fails_over_from_a_replica_that_is_down(
    stateful: Era2025Process, node_project: NodeProject
) -> None:
    with started(stateful.name, node_project) as other:
        config = gateway_config(
            {"old": [other.url, stateful.url]}, ROUTES, backend_options={"old": {"era": "2025"}}
        )
        other.stop()  # down before any session: each new caller's initialize is refused there
        async with serving(config) as gateway:
            add = {"name": "add", "arguments": {"a": 2, "b": 2}}
            for _ in range(2):  # round robin: the replica that is down comes first once
                assert text(await call(gateway.url, "tools/call", add)) == "4"


@pytest.mark.parametrize("stateful", ["ts-sdk1"], indirect=True)
async def test_a_question_on_the_sessions_get_stream_is_declined_too(
    stateful: Era2025Process,
) -> None:
    """The TypeScript SDK's own examples ask without a related request: on the session's GET
    stream, dropped when none is open (the tool would wait for the call's deadline)."""
    async with serving(gateway_config({"old": [stateful.url]}, ROUTES)) as gateway:
        declared: dict[str, Any] = {
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}
        }
        params = {"name": "confirm_unrelated", "arguments": {"question": "?"}, "_meta": declared}
        result = await call(gateway.url, "tools/call", params)
        assert result["isError"] is True
        assert "cannot put elicitation/create" in text(result)
        # The stream is held only while a call runs.
        (table,) = gateway.state.callers._tables.values()
        assert [held.stream for held in table.held.values()] == [None]


async def test_the_sdk_clients_of_2026_list_and_call_through_taskgate(
    gateway: RunningGateway,
) -> None:
    async with mcp.Client(gateway.url) as sdk:
        listed = await sdk.list_tools()
        assert {"add", "count"} <= {tool.name for tool in listed.tools}
        added = await sdk.call_tool("add", {"a": 20, "b": 22})
        assert [block.text for block in added.content if block.type == "text"] == ["42"]
    async with fastmcp.Client(gateway.url) as client:
        assert "greet" in {prompt.name for prompt in await client.list_prompts()}
        called = await client.call_tool("add", {"a": 1, "b": 2})
        assert [block.text for block in called.content if block.type == "text"] == ["3"]


async def test_two_instances_on_one_store_spread_calls_over_two_replicas_of_each(
    node_project: NodeProject, redis_url: str
) -> None:
    """Two replicas of each SDK's server behind two instances sharing Redis."""
    names = ("py-1", "py-2", "ts-1", "ts-2")
    with (
        started("py-sdk1", node_project, name="py-1") as py1,
        started("py-sdk1", node_project, name="py-2") as py2,
        started("ts-sdk1", node_project, name="ts-1") as ts1,
        started("ts-sdk1", node_project, name="ts-2") as ts2,
    ):
        urls = [server.url for server in (py1, py2, ts1, ts2)]
        config = gateway_config({"old": urls}, ROUTES, store=redis_url)
        async with serving(config) as first, serving(config) as second:
            for gateway in (first, second):
                answered = [
                    text(await call(gateway.url, "tools/call", {"name": "whoami"})) for _ in names
                ]
                # Each instance sends its calls round robin, each in sessions of its own there.
                assert sorted(answered) == list(names)
                replicas = gateway.state.backends["old"].replicas
                assert [gateway.state.callers.count(r) for r in replicas] == [1, 1, 1, 1]


async def test_a_stateless_server_costs_no_session_per_caller(
    gateway: RunningGateway, sdk1: Era2025Process
) -> None:
    """Each request of a stateless server is answered on its own: a caller's call goes as it
    is, in the revision of taskgate's own initialize, with no initialize of its own."""
    await gateway.state.catalog.views()  # taskgate's own initialize: it says it is stateless
    add = {"name": "add", "arguments": {"a": 3, "b": 4}}
    assert text(await call(gateway.url, "tools/call", add)) == "7"
    (replica,) = gateway.state.backends["old"].replicas
    assert gateway.state.callers.count(replica) == (0 if sdk1.stateless else 1)
    assert gateway.state.callers.opened == (0 if sdk1.stateless else 1)


async def test_a_call_the_server_moves_to_polling_is_resumed_for_a_2026_client(
    node_project: NodeProject,
) -> None:
    """A server that keeps its sessions' events primes each stream with an event id, and may
    close a call's stream before its answer (2025-11-25 polling): taskgate resumes it with
    Last-Event-ID, and the 2026-07-28 client gets the answer, without the priming event."""
    server = TSSDK1Process("ts-sdk1", node_project.require(), resumable=True)
    try:
        server.start()
        async with serving(gateway_config({"old": [server.url]}, ROUTES)) as gateway:
            messages = await exchange(gateway.url, "tools/call", {"name": "poll_me"})
            assert [text(m["result"]) for m in messages] == ["polled"]
            added = await exchange(
                gateway.url, "tools/call", {"name": "add", "arguments": {"a": 1, "b": 2}}
            )
            assert [text(m["result"]) for m in added] == ["3"]
    finally:
        server.cleanup()
