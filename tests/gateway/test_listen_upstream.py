"""resourceSubscriptions through taskgate's own upstream listens (issue 13, item 3), against
real backends: two replicas of the `mcp` SDK's MCPServer (backends/pushing.py, which serves
subscriptions/listen and pushes resources/updated) as `notes`, the two FastMCP 4.1.4 report
replicas (which answer listen with 404 -32601) as `reports`, and a stub that never
acknowledges. The downstream acknowledgement names only URIs an upstream acknowledged; each
replica's event reaches the client with its subscriptionId; a replica that restarts is listened
to again and followed by a fresh resources/updated; the client's close ends every upstream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.listen.upstream import UpstreamListens
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.listen import (
    ListenStream,
    listening,
    next_event,
    replica_tool,
    streams_become,
    subscription_id,
)
from tests.support.mcp import mcp_call, poll_until, result_of
from tests.support.procs import BackendProcess, PushingBackendProcess, start_backends, stop_all

WITHIN = 20.0  # seconds any one expected event or condition may take
UPDATED = "notifications/resources/updated"
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"

# notes://a and notes://b are listed by the notes replicas; notes://{name} is their template,
# routed only for globex: for acme, notes://zzz exists (globex reads it) but is hidden.
ROUTES: list[Any] = [
    {"resources": ["notes://*"], "backend": "notes"},
    {"resource_templates": ["notes://{name}"], "backend": "notes", "tenants": ["globex"]},
    {"resources": ["reports://about"], "backend": "reports"},
]


@pytest.fixture(scope="module")
def notes_backends() -> Iterator[list[PushingBackendProcess]]:
    """Two MCPServer replicas, "n1" and "n2", each with its own in-memory event bus."""
    backends = start_backends(["n1", "n2"], pushing=True)
    try:
        yield [b for b in backends if isinstance(b, PushingBackendProcess)]
    finally:
        stop_all(backends)


def upstream_config(
    issuer: Issuer,
    notes: list[PushingBackendProcess],
    reports: list[BackendProcess],
    *,
    backends: dict[str, list[str]] | None = None,
    routes: tuple[Any, ...] = (),
    **subscriptions: Any,
) -> Any:
    return gateway_config(
        {"notes": [n.url for n in notes], "reports": [r.url for r in reports], **(backends or {})},
        [*ROUTES, *routes],
        auth=jwt_auth(issuer),
        subscriptions=subscriptions,
    )


@pytest.fixture
async def gateway(
    issuer: Issuer,
    notes_backends: list[PushingBackendProcess],
    report_backends: list[BackendProcess],
) -> AsyncIterator[RunningGateway]:
    async with serving(upstream_config(issuer, notes_backends, report_backends)) as running:
        yield running
        async with asyncio.timeout(WITHIN):
            await running.state.listens.idle.wait()  # the last stream's end has run


def upstream_of(gateway: RunningGateway) -> UpstreamListens:
    return gateway.state.listens.upstream


async def acknowledged(stream: ListenStream) -> dict[str, Any]:
    """The acknowledgement's `notifications`, checking it comes first."""
    assert stream.status == 200
    ack = await next_event(stream)
    assert ack["method"] == ACKNOWLEDGED, ack
    notifications: dict[str, Any] = ack["params"]["notifications"]
    return notifications


async def touch(http: aiohttp.ClientSession, replica: BackendProcess, uri: str) -> None:
    """Change `uri` on one replica, directly (not through taskgate)."""
    await replica_tool(http, replica, "touch", uri=uri)


def updated(uri: str, listen_id: int | str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": UPDATED,
        "params": {"uri": uri, "_meta": {"io.modelcontextprotocol/subscriptionId": listen_id}},
    }


# --- the acknowledgement -------------------------------------------------------------------


async def test_discover_advertises_subscribe_when_a_routed_backend_pushes(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    report_backends: list[BackendProcess],
) -> None:
    # MCPServer advertises resources {listChanged: true, subscribe: true}; FastMCP subscribe false.
    answer = await mcp_call(http, gateway.url, "server/discover", token=issuer.token())
    assert result_of(answer.message)["capabilities"]["resources"] == {
        "listChanged": True,
        "subscribe": True,
    }
    config = gateway_config(
        {"reports": [r.url for r in report_backends]},
        [{"resources": ["reports://about"], "backend": "reports"}],
    )
    async with serving(config) as only_reports:
        answer = await mcp_call(http, only_reports.url, "server/discover")
    assert result_of(answer.message)["capabilities"]["resources"] == {"listChanged": True}


async def test_the_ack_honours_only_uris_an_upstream_acknowledged_leaving_out_the_rest_alike(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway
) -> None:
    asked = ["notes://b", "reports://about", "other://x", "notes://zzz", "notes://a"]
    acme = issuer.token("acme", "ann")
    async with listening(
        http, gateway.url, {"resourceSubscriptions": asked}, id="a1", token=acme
    ) as stream:
        # reports://about: routed, but FastMCP cannot push (404); other://x: no route;
        # notes://zzz: only globex's route reaches it. None named, none told apart.
        assert await acknowledged(stream) == {"resourceSubscriptions": ["notes://b", "notes://a"]}
        # one upstream listen per notes replica; the reports ones ended with their 404
        assert upstream_of(gateway).streams == 2
    async with asyncio.timeout(WITHIN):
        await gateway.state.listens.idle.wait()  # the stream's end closed its upstreams
    assert upstream_of(gateway).streams == 0

    globex = issuer.token("globex", "gus")
    async with listening(
        http, gateway.url, {"resourceSubscriptions": asked}, id="g1", token=globex
    ) as stream:
        # the template route makes notes://zzz globex's: the same URI, acknowledged
        assert await acknowledged(stream) == {
            "resourceSubscriptions": ["notes://b", "notes://zzz", "notes://a"]
        }

    # Nothing honoured: the key is left out, as when no backend pushes.
    async with listening(
        http,
        gateway.url,
        {"toolsListChanged": True, "resourceSubscriptions": ["reports://about", "other://x"]},
        id="a2",
        token=acme,
    ) as stream:
        assert await acknowledged(stream) == {"toolsListChanged": True}
        assert (upstream_of(gateway).listens, upstream_of(gateway).streams) == (1, 0)


# --- relaying ------------------------------------------------------------------------------


@pytest.mark.parametrize("listen_id", [41, "forty-one"])
async def test_each_replicas_update_reaches_the_client_with_its_subscription_id(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    notes_backends: list[PushingBackendProcess],
    listen_id: int | str,
) -> None:
    notifications = {"resourceSubscriptions": ["notes://a"]}
    async with listening(
        http, gateway.url, notifications, id=listen_id, token=issuer.token()
    ) as stream:
        assert await acknowledged(stream) == notifications
        for replica in notes_backends:
            # notes://b is not subscribed: nothing for it; the next event is a's, which
            # the replica published after b's on the same listen stream.
            await touch(http, replica, "notes://b")
            await touch(http, replica, "notes://a")
            event = await next_event(stream)
            assert event == updated("notes://a", listen_id)
            assert type(subscription_id(event)) is type(listen_id)


@pytest.mark.parametrize("how", ["crash", "graceful"])
async def test_a_restarted_replica_is_listened_to_again_and_a_fresh_update_follows(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    notes_backends: list[PushingBackendProcess],
    how: str,
) -> None:
    n1, n2 = notes_backends
    notifications = {"resourceSubscriptions": ["notes://a"]}
    try:
        async with listening(
            http, gateway.url, notifications, id="r1", token=issuer.token()
        ) as stream:
            assert await acknowledged(stream) == notifications
            assert upstream_of(gateway).streams == 2
            if how == "crash":
                await asyncio.to_thread(n1.kill)  # SIGKILL: its listen stream breaks off
                await asyncio.to_thread(n1.start)  # on the same port
            else:
                # SIGTERM: MCPServer ends the listen with its result (never relayed), then stops
                await asyncio.to_thread(n1.restart)
            # taskgate listens again (with backoff); nothing is replayed, so it says notes://a
            # may have changed
            assert await next_event(stream) == updated("notes://a", "r1")
            assert await replica_tool(http, n1, "listeners") == {"streams": 1}
            await touch(http, n1, "notes://a")
            assert await next_event(stream) == updated("notes://a", "r1")
            # the other replica's listen held throughout
            await touch(http, n2, "notes://a")
            assert await next_event(stream) == updated("notes://a", "r1")
    finally:
        if n1.returncode is not None:
            await asyncio.to_thread(n1.start)


async def test_closing_the_stream_ends_every_upstream_listen(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    notes_backends: list[PushingBackendProcess],
) -> None:
    hub = gateway.state.listens
    upstream = upstream_of(gateway)
    await streams_become(http, notes_backends, 0)  # what earlier tests held is gone
    notifications = {"resourceSubscriptions": ["notes://a", "notes://b", "reports://about"]}
    async with listening(http, gateway.url, notifications, id=7, token=issuer.token()) as stream:
        await acknowledged(stream)
        await streams_become(http, notes_backends, 1)
        assert (upstream.listens, upstream.streams) == (1, 2)
    async with asyncio.timeout(WITHIN):
        await hub.idle.wait()  # the stream's end ran: its upstream listens are closed
    assert (upstream.listens, upstream.streams) == (0, 0)
    await streams_become(http, notes_backends, 0)  # and each replica saw its stream end


# --- backends that cannot push -------------------------------------------------------------

SILENT_LISTENS = web.AppKey("silent_listens", list)
SILENT_REQUESTS = web.AppKey("silent_requests", list)


def silent_app() -> web.Application:
    """A backend that says it pushes, lists `silent://x`, and never acknowledges a listen:
    it answers with the event stream's head and a comment, then nothing."""
    app = web.Application()
    app[SILENT_LISTENS] = []  # one Event per listen, set when the client closes it
    app[SILENT_REQUESTS] = []  # (headers, body) of each listen
    app.router.add_post("/mcp", _silent)
    return app


async def _silent(request: web.Request) -> web.StreamResponse:
    message = orjson.loads(await request.read())
    method = message["method"]
    results: dict[str, dict[str, Any]] = {
        "server/discover": {
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {}, "resources": {"subscribe": True}},
        },
        "tools/list": {"tools": []},
        "resources/list": {"resources": [{"uri": "silent://x", "name": "x"}]},
        "resources/templates/list": {"resourceTemplates": []},
    }
    if method in results:
        result = {"resultType": "complete", **results[method]}
        return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": result})
    assert method == "subscriptions/listen", method
    request.app[SILENT_REQUESTS].append((request.headers.copy(), message))
    closed = asyncio.Event()
    request.app[SILENT_LISTENS].append(closed)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b": ping\n\n")
    try:
        await asyncio.Event().wait()  # until the client leaves (the handler is cancelled)
    finally:
        closed.set()
    return response


@pytest.fixture
async def silent_url() -> AsyncIterator[tuple[str, web.Application]]:
    app = silent_app()
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("/mcp")), app
    finally:
        await server.close()


async def test_a_backend_that_never_acknowledges_honours_nothing_and_the_stream_works(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    notes_backends: list[PushingBackendProcess],
    report_backends: list[BackendProcess],
    silent_url: tuple[str, web.Application],
) -> None:
    url, app = silent_url
    config = upstream_config(
        issuer,
        notes_backends,
        report_backends,
        backends={"silent": [url]},
        routes=({"resources": ["silent://*"], "backend": "silent"},),
        ack_timeout_s=2.0,
    )
    asked = ["silent://x", "reports://about", "notes://a"]
    async with serving(config) as gateway:
        async with listening(
            http, gateway.url, {"resourceSubscriptions": asked}, id=9, token=issuer.token()
        ) as stream:
            # after ack_timeout_s: silent://x (silent) and reports://about (404) are left out
            assert await acknowledged(stream) == {"resourceSubscriptions": ["notes://a"]}
            (closed,) = app[SILENT_LISTENS]
            assert upstream_of(gateway).streams == 2  # its listen was closed before the ack
            async with asyncio.timeout(WITHIN):
                await closed.wait()  # and the backend saw it go
            await touch(http, notes_backends[1], "notes://a")
            assert await next_event(stream) == updated("notes://a", 9)
        async with asyncio.timeout(WITHIN):
            await gateway.state.listens.idle.wait()
    # taskgate's own listen: its own id, its own envelope, only this backend's URIs, and
    # nothing of the client's (no token, no listen id)
    ((headers, body),) = app[SILENT_REQUESTS]
    assert body["id"].startswith("taskgate-listen-")
    assert body["params"] == {
        "notifications": {"resourceSubscriptions": ["silent://x"]},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        },
    }
    assert headers["Mcp-Method"] == "subscriptions/listen"
    assert headers["MCP-Protocol-Version"] == "2026-07-28"
    assert "text/event-stream" in headers["Accept"]
    assert "Authorization" not in headers


async def test_waiting_for_a_silent_backends_acknowledgement_holds_no_request_slot(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    notes_backends: list[PushingBackendProcess],
    report_backends: list[BackendProcess],
    silent_url: tuple[str, web.Application],
) -> None:
    """With one request slot in all, a listen waiting out a silent backend's acknowledgement
    (ack_timeout_s 5) leaves the slot to other requests: the wait comes after admission."""
    url, app = silent_url
    config = gateway_config(
        {"silent": [url], "reports": [r.url for r in report_backends]},
        [{"resources": ["silent://*"], "backend": "silent"}, (["echo"], "reports")],
        auth=jwt_auth(issuer),
        listen={"max_in_flight": 1},
        subscriptions={"ack_timeout_s": 5.0},
    )
    token = issuer.token()
    async with serving(config) as gateway:
        watch = {"resourceSubscriptions": ["silent://x"], "toolsListChanged": True}

        async def listen() -> dict[str, Any]:
            async with listening(http, gateway.url, watch, id=12, token=token) as stream:
                return await acknowledged(stream)

        async def silent_asked() -> int:
            return len(app[SILENT_REQUESTS])

        async def tools_list() -> int:
            return (await mcp_call(http, gateway.url, "tools/list", token=token)).status

        waiting = asyncio.create_task(listen())
        await poll_until(silent_asked, bool, within=WITHIN)  # its upstream listen went out
        # well within the 5 s the listen waits for it: the one slot is free
        assert await poll_until(tools_list, lambda status: status == 200, within=2.5) == 200
        assert not waiting.done(), "the listen was still waiting for the acknowledgement"
        async with asyncio.timeout(WITHIN):
            assert await waiting == {"toolsListChanged": True}
            await gateway.state.listens.idle.wait()
