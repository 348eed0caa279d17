"""Clients of the 2025 era through taskgate (gateway/legacy), on the raw wire and with FastMCP's
client in legacy mode, against real report replicas that serve both eras.

What a user of such a client relies on: taskgate answers initialize and owns the session; the
session is bound to the caller's token; calls reach the right backend, with a backend's requests
to the client (elicitation) under ids that never collide and answers that reach the backend that
asked, on whichever instance they arrive; a backend that loses its session makes the client's
session 404, and a new initialize recovers; modern traffic is untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from fastmcp import Client

from gateway.legacy.wire import denamespaced
from gateway.store.base import now_ms
from gateway.store.sessions import owner_key
from tests.gateway.conftest import EchoUpstream
from tests.gateway.test_observability import scrape, value
from tests.support.echo_upstream import SEEN
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.legacy import LegacyClient
from tests.support.mcp import JsonObject, mcp_call, poll_until, result_of
from tests.support.procs import BackendProcess, stop_all
from tests.support.round_robin import round_robin

ROUTES: list[tuple[list[str], str] | dict[str, Any]] = [
    {"tools": ["echo", "ask", "slow_count", "stats"], "backend": "reports"},
    {"tools": ["whoami", "ask_billing"], "backend": "billing"},
    {"tools": ["set_visible"], "backend": "billing", "scopes": ["admin"]},
]


@pytest.fixture(scope="module")
def asking_backends() -> Iterator[list[BackendProcess]]:
    """Two backends, each one replica that elicits: `ask` on reports, `ask_billing` on billing."""
    processes = [
        BackendProcess("r1", extra_args=("--asking",)),
        BackendProcess("b1", extra_args=("--asking", "--ask-name", "ask_billing")),
    ]
    for process in processes:
        process.launch()
    try:
        for process in processes:
            process.wait_ready()
        yield processes
    finally:
        stop_all(processes)


def _config(backends: list[BackendProcess], **sections: Any) -> Any:
    reports, billing = backends
    return gateway_config({"reports": [reports.url], "billing": [billing.url]}, ROUTES, **sections)


@contextlib.asynccontextmanager
async def _gateway(
    backends: list[BackendProcess], **sections: Any
) -> AsyncIterator[RunningGateway]:
    async with serving(_config(backends, **sections)) as gateway:
        yield gateway


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def _text(result: JsonObject) -> str:
    text: str = result["content"][0]["text"]
    return text


async def test_initialize_is_answered_by_taskgate_with_its_own_session(
    asking_backends: list[BackendProcess], http: aiohttp.ClientSession
) -> None:
    async with _gateway(asking_backends) as gateway:
        client = LegacyClient(http, gateway.url, version="2025-06-18")
        answer = await client.initialize()
        assert answer.status == 200
        result = answer.result
        assert result["protocolVersion"] == "2025-06-18"  # the client's, being of the era
        assert result["serverInfo"]["name"] == "taskgate"
        capabilities = result["capabilities"]
        assert capabilities["tools"] == {"listChanged": True}
        # What taskgate cannot carry is not offered: legacy tasks, the extension. Logging is,
        # since the backends serve it (logging/setLevel reaches each upstream session).
        assert not {"tasks", "extensions", "experimental"} & capabilities.keys()
        assert capabilities["logging"] == {}
        session_id = answer.headers["Mcp-Session-Id"]
        assert len(session_id) >= 32
        assert all(0x21 <= ord(c) <= 0x7E for c in session_id)
        # No upstream session yet: each opens on first use.
        state = gateway.state
        assert state.legacy is not None
        stored = await state.legacy.sessions.store.session(session_id, owner_key("", ""))
        assert stored is not None
        assert stored.upstreams == {}

        other = LegacyClient(http, gateway.url)
        assert (await other.initialize("2024-11-05")).result["protocolVersion"] == "2025-11-25"


async def test_lists_have_the_legacy_shape_and_calls_reach_each_backend(
    asking_backends: list[BackendProcess], http: aiohttp.ClientSession
) -> None:
    async with _gateway(asking_backends) as gateway:
        client = LegacyClient(http, gateway.url)
        await client.initialize()
        listed = (await client.request("tools/list")).result
        assert not {"resultType", "ttlMs", "cacheScope", "_meta"} & listed.keys()
        names = {tool["name"] for tool in listed["tools"]}
        assert {"echo", "ask", "whoami", "ask_billing"} <= names
        for tool in listed["tools"]:
            assert not {"resultType", "ttlMs", "cacheScope"} & tool.keys()
        echoed = await client.request("tools/call", {"name": "echo", "arguments": {"text": "hi"}})
        assert _text(echoed.result) == "hi"
        who = await client.request("tools/call", {"name": "whoami", "arguments": {}})
        assert orjson.loads(_text(who.result))["replica"] == "b1"
        # One upstream session per backend, recorded in the client's session.
        assert gateway.state.legacy is not None
        stored = await gateway.state.legacy.sessions.store.session(
            client.session_id or "", owner_key("", "")
        )
        assert stored is not None
        assert set(stored.upstreams) == {"reports", "billing"}
        # A legacy params.task is ignored: the call is served as a plain call.
        tasked = await client.request(
            "tools/call", {"name": "echo", "arguments": {"text": "t"}, "task": {"ttl": 60000}}
        )
        assert _text(tasked.result) == "t"
        assert "task" not in tasked.result
        for method in ("tasks/list", "tasks/result", "tasks/get"):
            refused = await client.request(method, {"taskId": "x"})
            assert refused.status == 200, method
            assert refused.error["code"] == -32601, method
        # A level is taken (and sent to each upstream session of the client's); a level that
        # is not one is refused.
        assert (await client.request("logging/setLevel", {"level": "info"})).result == {}
        bad = await client.request("logging/setLevel", {"level": "loud"})
        assert bad.error["code"] == -32602
        pinged = await client.request("ping")
        assert pinged.result == {}


async def test_the_session_is_bound_to_its_caller_and_ends_with_delete(
    asking_backends: list[BackendProcess], http: aiohttp.ClientSession, issuer: Issuer
) -> None:
    async with _gateway(asking_backends, auth=jwt_auth(issuer)) as gateway:
        alice = LegacyClient(http, gateway.url, token=issuer.token("acme", "alice"))
        await alice.initialize()
        assert (
            await alice.request("tools/call", {"name": "echo", "arguments": {"text": "a"}})
        ).status == 200
        # The same id with another principal's token, or another tenant's: 404, as unknown.
        for token in (issuer.token("acme", "bob"), issuer.token("globex", "alice")):
            thief = LegacyClient(http, gateway.url, token=token, session_id=alice.session_id)
            stolen = await thief.request("tools/list")
            assert stolen.status == 404
            assert stolen.error["message"] == "Session not found"
        unknown = LegacyClient(
            http, gateway.url, token=issuer.token("acme", "alice"), session_id="no-such-session"
        )
        assert (await unknown.request("tools/list")).status == 404
        # Without a session: 400, naming the header.
        bare = LegacyClient(http, gateway.url, token=issuer.token("acme", "alice"))
        missing = await bare.request("tools/list")
        assert missing.status == 400
        assert "Mcp-Session-Id" in missing.error["message"]
        # A token is still needed first: 401 before anything about sessions.
        anonymous = LegacyClient(http, gateway.url, session_id=alice.session_id)
        assert (await anonymous.request("tools/list")).status == 401
        # DELETE ends it everywhere: 404 afterwards, here and on the backend.
        state = gateway.state.legacy
        assert state is not None
        assert alice.session_id is not None
        stored = await state.sessions.store.session(alice.session_id, owner_key("acme", "alice"))
        assert stored is not None
        upstream = stored.upstreams["reports"]
        direct = LegacyClient(http, upstream.replica, session_id=upstream.session_id)
        assert (await direct.request("tools/list")).status == 200  # alive on the backend
        assert await alice.delete() == 200
        assert (await alice.request("tools/list")).status == 404
        assert await alice.delete() == 404
        assert (await direct.request("tools/list")).status == 404  # ended there too


async def test_a_session_this_instance_keeps_serves_no_other_callers_call(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, issuer: Issuer
) -> None:
    """A relayed call may use this instance's last read of the session (legacy.session_cache_s,
    60 s here, beyond the test); that copy is its caller's alone: another principal's token, or
    another tenant's, with the same id gets 404 and the backend never sees the call."""
    config = gateway_config(
        {"echo": [echo_upstream.url]},
        [(["*"], "echo")],
        auth=jwt_auth(issuer),
        legacy={"session_cache_s": 60},
    )
    seen = echo_upstream.app[SEEN]

    def calls() -> list[JsonObject]:
        sent = (orjson.loads(x["body"]) for x in seen)
        return [m for m in sent if m["method"] == "tools/call"]

    async with serving(config) as gateway:
        alice = LegacyClient(http, gateway.url, token=issuer.token("acme", "alice"))
        await alice.initialize()
        own = {"name": "headers", "arguments": {"caller": "alice"}}
        assert (await alice.request("tools/call", own)).status == 200  # the session is kept now
        assert len(calls()) == 1
        for token in (issuer.token("acme", "bob"), issuer.token("globex", "alice")):
            thief = LegacyClient(http, gateway.url, token=token, session_id=alice.session_id)
            stolen = {"name": "headers", "arguments": {"caller": "thief"}}
            answer = await thief.request("tools/call", stolen)
            assert answer.status == 404
            assert answer.error == {"code": -32600, "message": "Session not found"}
        assert [m["params"]["arguments"]["caller"] for m in calls()] == ["alice"]
        # Still alice's, and still kept: her next call is served.
        assert (await alice.request("tools/call", own)).status == 200
        assert len(calls()) == 2


async def test_a_backends_elicitation_is_answered_through_another_instance(
    asking_backends: list[BackendProcess], tmp_path: Path
) -> None:
    """FastMCP's client in legacy mode, behind a proxy that alternates between two taskgate
    instances sharing one store: the elicitation comes on one instance's stream and the
    client's answer is POSTed to the other, which delivers it to the backend that asked."""
    store = f"sqlite:///{tmp_path / 'shared.db'}"
    config = _config(asking_backends, store=store)
    asked: list[str] = []

    async def answer(message: str, response_type: Any, params: Any, context: Any) -> Any:
        asked.append(message)
        return {"value": "yes"}

    async with (
        serving(config) as one,
        serving(config) as two,
        round_robin([one.url.removesuffix("/mcp"), two.url.removesuffix("/mcp")]) as proxy,
    ):
        url = proxy.url_for("/mcp")
        async with Client(url, mode="legacy", elicitation_handler=answer) as client:
            result = await client.call_tool("ask", {"question": "ship it?"})
            assert result.content[0].text == "r1:accept:yes"
            assert asked == ["ship it?"]
            who = await client.call_tool("whoami", {})
            assert orjson.loads(who.content[0].text)["replica"] == "b1"
        answers = [
            x for x in proxy.exchanges if b'"result"' in x.body and b'"method"' not in x.body
        ]
        calls = [x for x in proxy.exchanges if b'"name":"ask"' in x.body]
        assert len(answers) == 1
        assert len(calls) == 1
        assert answers[0].upstream != calls[0].upstream  # the answer went to the other one
        assert answers[0].status == 202


async def test_two_backends_asking_with_the_same_id_each_get_their_own_answer(
    asking_backends: list[BackendProcess], http: aiohttp.ClientSession
) -> None:
    async with _gateway(asking_backends) as gateway:
        client = LegacyClient(http, gateway.url)
        await client.initialize()
        # Open both upstream sessions first, so that each backend's first request id is the
        # same (FastMCP numbers a session's requests to the client from the same start).
        await client.request("tools/call", {"name": "echo", "arguments": {"text": "x"}})
        await client.request("tools/call", {"name": "whoami", "arguments": {}})
        streams = [
            _open_call(http, client, "ask", "for reports"),
            _open_call(http, client, "ask_billing", "for billing"),
        ]
        opened = await asyncio.gather(*streams)
        try:
            asks = [await stream.next_request() for stream in opened]
            ids = [ask["id"] for ask in asks]
            assert len(set(ids)) == 2  # namespaced apart
            origins = [denamespaced(i) for i in ids]
            assert {o[0] for o in origins if o is not None} == {"reports", "billing"}
            assert origins[0] is not None
            assert origins[1] is not None
            assert origins[0][1] == origins[1][1]  # the backends' own ids are the same
            for ask in reversed(asks):  # answered in the other order, each its own answer
                reply = {"action": "accept", "content": {"value": ask["params"]["message"]}}
                posted = await client.post({"jsonrpc": "2.0", "id": ask["id"], "result": reply})
                assert posted.status == 202
            results = [await stream.result() for stream in opened]
        finally:
            for stream in opened:
                stream.close()
        assert _text(results[0]) == "r1:accept:for reports"
        assert _text(results[1]) == "b1:accept:for billing"


class _OpenCall:
    """A tools/call whose event stream is read as it comes."""

    def __init__(self, response: aiohttp.ClientResponse, request_id: int) -> None:
        self._response = response
        self._id = request_id
        self._buffer = b""

    async def _message(self) -> JsonObject:
        async with asyncio.timeout(20):
            while b"\n\n" not in self._buffer:
                chunk = await self._response.content.readany()
                assert chunk, "the stream ended early"
                self._buffer += chunk.replace(b"\r\n", b"\n")  # any SSE line end
        event, _, self._buffer = self._buffer.partition(b"\n\n")
        data = b"\n".join(
            line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")
        )
        if not data:
            return await self._message()
        message: JsonObject = orjson.loads(data)
        return message

    async def next_request(self) -> JsonObject:
        while True:
            message = await self._message()
            if "method" in message and "id" in message:
                return message

    async def result(self) -> JsonObject:
        while True:
            message = await self._message()
            if message.get("id") == self._id and "result" in message:
                result: JsonObject = message["result"]
                return result

    def close(self) -> None:
        self._response.close()


async def _open_call(
    http: aiohttp.ClientSession, client: LegacyClient, tool: str, question: str
) -> _OpenCall:
    request_id = 1000 + len(tool)
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": {"question": question}},
    }
    response = await http.post(client.url, data=orjson.dumps(body), headers=client.headers())
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    return _OpenCall(response, request_id)


async def test_a_backend_restart_gives_404_and_a_new_initialize_recovers(
    http: aiohttp.ClientSession,
) -> None:
    backends = [
        BackendProcess("r1", extra_args=("--asking",)),
        BackendProcess("b1", extra_args=("--asking", "--ask-name", "ask_billing")),
    ]
    for backend in backends:
        backend.start()
    try:
        async with _gateway(backends) as gateway:
            client = LegacyClient(http, gateway.url)
            await client.initialize()
            echoed = await client.request(
                "tools/call", {"name": "echo", "arguments": {"text": "1"}}
            )
            assert _text(echoed.result) == "1"
            backends[0].restart()  # same port; its sessions are gone
            lost = await client.request("tools/call", {"name": "echo", "arguments": {"text": "2"}})
            assert lost.status == 404
            assert lost.error["message"] == "Session not found"
            assert (await client.request("tools/list")).status == 404  # the whole session ended
            await client.initialize()
            again = await client.request("tools/call", {"name": "echo", "arguments": {"text": "3"}})
            assert _text(again.result) == "3"
    finally:
        stop_all(backends)


async def test_cancelled_reaches_the_backend(
    asking_backends: list[BackendProcess], http: aiohttp.ClientSession
) -> None:
    async with _gateway(asking_backends) as gateway:
        client = LegacyClient(http, gateway.url)
        await client.initialize()

        async def counts() -> JsonObject:
            stats = await client.request("tools/call", {"name": "stats", "arguments": {}})
            value: JsonObject = orjson.loads(_text(stats.result))
            return value

        before = await counts()
        body = {
            "jsonrpc": "2.0",
            "id": "slow-1",
            "method": "tools/call",
            "params": {"name": "slow_count", "arguments": {"n": 400, "delay_ms": 50}},
        }
        call = asyncio.ensure_future(
            http.post(client.url, data=orjson.dumps(body), headers=client.headers())
        )
        started = before["slow_started"] + 1
        await poll_until(counts, lambda c: c["slow_started"] >= started)
        cancel = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": "slow-1", "reason": "changed my mind"},
        }
        assert (await client.post(cancel)).status == 202
        cancelled = before["slow_cancelled"] + 1
        await poll_until(counts, lambda c: c["slow_cancelled"] >= cancelled)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
            response = await call
            response.close()


async def test_a_callers_least_recently_used_session_makes_room_and_idle_ones_expire(
    asking_backends: list[BackendProcess], http: aiohttp.ClientSession, issuer: Issuer
) -> None:
    """2025-era clients seldom send DELETE: at max_sessions_per_principal a new initialize ends
    the caller's least recently used session (and its upstream sessions) instead of locking the
    caller out; another caller's sessions are never touched."""
    legacy = {"max_sessions_per_principal": 2}
    async with _gateway(asking_backends, auth=jwt_auth(issuer), legacy=legacy) as gateway:
        token = issuer.token("acme", "alice")
        first, second, third = (LegacyClient(http, gateway.url, token=token) for _ in range(3))
        bob = LegacyClient(http, gateway.url, token=issuer.token("acme", "bob"))
        assert (await bob.initialize()).status == 200
        assert (await first.initialize()).status == 200
        assert (await second.initialize()).status == 200
        echoed = await second.request("tools/call", {"name": "echo", "arguments": {"text": "s"}})
        assert _text(echoed.result) == "s"  # second has an upstream session on reports now
        # Make second the least recently used: its idle expiry the soonest, as if unused for
        # most of session_idle_s.
        state = gateway.state.legacy
        assert state is not None
        assert second.session_id is not None
        owner = owner_key("acme", "alice")
        await state.sessions.store.touch_session(second.session_id, owner, now_ms() + 60_000)
        assert (await third.initialize()).status == 200
        assert (await second.request("tools/list")).status == 404  # evicted
        assert (await first.request("tools/list")).status == 200
        assert (await third.request("tools/list")).status == 200
        assert (await bob.request("tools/list")).status == 200  # another caller's, untouched
        assert state.sessions.events["evicted"] == 1
        # Idle expiry: a session whose expiry passed is gone (404).
        assert first.session_id is not None
        await state.sessions.store.touch_session(first.session_id, owner, now_ms() - 1)
        assert (await first.request("tools/list")).status == 404


async def test_a_batch_of_2025_03_26(
    asking_backends: list[BackendProcess], http: aiohttp.ClientSession
) -> None:
    async with _gateway(asking_backends) as gateway:
        client = LegacyClient(http, gateway.url, version="2025-03-26")
        await client.initialize()
        batch = [
            {"jsonrpc": "2.0", "id": 1, "method": "ping"},
            {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"},
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": "b"}},
            },
            {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "nope"}},
        ]
        answer = await client.post(batch)
        assert answer.status == 200
        by_id = {message["id"]: message for message in answer.messages}
        assert by_id[1]["result"] == {}
        assert _text(by_id[2]["result"]) == "b"
        assert by_id[3]["error"]["code"] == -32602  # unknown tool, as alone
        # A later revision has no batches.
        modern_era = LegacyClient(http, gateway.url)
        await modern_era.initialize()
        assert (await modern_era.post(batch[:1])).status == 400


async def test_the_get_stream_says_when_the_tool_list_changes(
    asking_backends: list[BackendProcess], http: aiohttp.ClientSession, issuer: Issuer
) -> None:
    sections: dict[str, Any] = {
        "auth": jwt_auth(issuer),
        "discovery": {"refresh_s": 0.2},
        "subscriptions": {"keepalive_s": 0.5},
    }
    async with _gateway(asking_backends, **sections) as gateway:
        client = LegacyClient(
            http, gateway.url, token=issuer.token("acme", "alice", scopes=("admin",))
        )
        await client.initialize()
        headers = {**client.headers(), "Accept": "text/event-stream"}
        async with http.get(gateway.url, headers=headers) as stream:
            assert stream.status == 200
            assert stream.headers["Content-Type"].startswith("text/event-stream")
            hide = {
                "name": "set_visible",
                "arguments": {"kind": "tool", "name": "whoami", "on": False},
            }
            try:
                assert (await client.request("tools/call", hide)).status == 200
                seen = b""
                async with asyncio.timeout(15):
                    while b"notifications/tools/list_changed" not in seen:
                        chunk = await stream.content.readany()
                        assert chunk, "the stream ended"
                        seen += chunk
                listed = (await client.request("tools/list")).result
                assert "whoami" not in {tool["name"] for tool in listed["tools"]}
            finally:
                show = {
                    "name": "set_visible",
                    "arguments": {"kind": "tool", "name": "whoami", "on": True},
                }
                await client.request("tools/call", show)
        # A GET without a session is 405, as on a 2026-07-28 endpoint; an unknown one 404.
        bare = {k: v for k, v in headers.items() if k != "Mcp-Session-Id"}
        async with http.get(gateway.url, headers=bare) as response:
            assert response.status == 405
        async with http.get(gateway.url, headers={**headers, "Mcp-Session-Id": "gone"}) as response:
            assert response.status == 404


async def test_scopes_and_no_token_passthrough_hold_for_legacy_calls(
    asking_backends: list[BackendProcess], http: aiohttp.ClientSession, issuer: Issuer
) -> None:
    async with _gateway(asking_backends, auth=jwt_auth(issuer)) as gateway:
        client = LegacyClient(http, gateway.url, token=issuer.token("acme", "alice"))
        await client.initialize()
        hide = {"name": "set_visible", "arguments": {"kind": "tool", "name": "echo", "on": True}}
        refused = await client.request("tools/call", hide)
        assert refused.status == 403
        assert "insufficient_scope" in refused.headers.get("WWW-Authenticate", "")


async def test_with_legacy_off_a_2025_request_is_told_the_revision(
    asking_backends: list[BackendProcess], http: aiohttp.ClientSession
) -> None:
    async with _gateway(asking_backends, legacy={"enabled": False}) as gateway:
        client = LegacyClient(http, gateway.url)
        refused = await client.initialize()
        assert refused.status == 400
        assert "2026-07-28" in refused.error["message"]
        assert "2025" in refused.error["message"]
        client.session_id = "anything"
        assert (await client.request("tools/list")).status == 400
        legacy_get = {"Accept": "text/event-stream", "Mcp-Session-Id": "anything"}
        async with http.get(gateway.url, headers=legacy_get) as response:
            assert response.status == 405
        # Modern traffic is served as ever.
        listed = await mcp_call(http, gateway.url, "tools/list", {})
        assert "echo" in {tool["name"] for tool in result_of(listed.message)["tools"]}


async def test_upstream_gets_taskgates_session_and_identity_never_the_clients_token(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, issuer: Issuer
) -> None:
    config = gateway_config(
        {"echo": [echo_upstream.url]},
        [(["*"], "echo")],
        auth=jwt_auth(issuer),
        backend_options={"echo": {"identity_headers": {"tenant": "X-Tenant"}}},
    )
    async with serving(config) as gateway:
        token = issuer.token("acme", "alice")
        client = LegacyClient(http, gateway.url, token=token, version="2025-06-18")
        await client.initialize()
        seen = (await client.request("tools/call", {"name": "headers"})).result
        headers = {key.lower(): value for key, value in seen["structuredContent"]["headers"]}
        assert "authorization" not in headers  # no token passthrough
        assert token not in str(headers)
        assert headers["mcp-session-id"].startswith("echo-session-")  # the backend's own id
        assert headers["mcp-session-id"] != client.session_id
        assert headers["mcp-protocol-version"] == "2025-06-18"
        assert headers["x-tenant"] == "acme"
        sent = [orjson.loads(x["body"]) for x in echo_upstream.app[SEEN]]
        # the catalogue's own calls aside
        opened = [m for m in sent if m["method"] not in ("server/discover", "tools/list")]
        assert [m["method"] for m in opened[:2]] == ["initialize", "notifications/initialized"]
        assert opened[0]["params"]["protocolVersion"] == "2025-06-18"
        assert opened[0]["params"]["clientInfo"] == {"name": "raw-legacy", "version": "1"}


async def test_a_delete_on_one_instance_is_a_404_on_the_other_at_once(
    asking_backends: list[BackendProcess], http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The other instance keeps its last read of the session (legacy.session_cache_s, 60 s
    here, far beyond the test): still, after DELETE anywhere, every request gets 404, since a
    relayed call meets the backend's own 404 for the upstream session DELETE ended."""
    config = _config(
        asking_backends,
        store=f"sqlite:///{tmp_path / 'shared.db'}",
        legacy={"session_cache_s": 60},
    )
    async with serving(config) as one, serving(config) as two:
        client = LegacyClient(http, one.url)
        await client.initialize()
        client.url = two.url
        for tool, arguments in (("echo", {"text": "x"}), ("whoami", {})):
            called = await client.request("tools/call", {"name": tool, "arguments": arguments})
            assert called.status == 200  # two now keeps the session, both upstreams bound
        client.url = one.url
        assert await client.delete() == 200
        client.url = two.url
        gone = await client.request("tools/call", {"name": "echo", "arguments": {"text": "y"}})
        assert gone.status == 404
        assert (await client.request("tools/list")).status == 404


async def test_metrics_count_2025_era_sessions_and_streams(
    asking_backends: list[BackendProcess], http: aiohttp.ClientSession
) -> None:
    async with _gateway(asking_backends, admin={"host": "127.0.0.1", "port": 0}) as gateway:
        assert gateway.admin_url is not None
        client = LegacyClient(http, gateway.url)
        await client.initialize()
        headers = {**client.headers(), "Accept": "text/event-stream"}
        async with http.get(gateway.url, headers=headers) as stream:
            assert stream.status == 200
            _, samples = await scrape(http, gateway.admin_url)
            assert value(samples, "taskgate_legacy_streams") == 1
        assert await client.delete() == 200
        _, samples = await scrape(http, gateway.admin_url)
        assert value(samples, "taskgate_legacy_sessions_total", event="opened") == 1
        assert value(samples, "taskgate_legacy_sessions_total", event="ended") == 1
        initialized = [
            count
            for (name, labels), count in samples.items()
            if name == "taskgate_requests_total" and ("method", "initialize") in labels
        ]
        assert sum(initialized) == 1
