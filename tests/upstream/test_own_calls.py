"""taskgate's own calls to a replica (discovery, probes, listen pollers, the 2025-era
initialize) go over the relay's pool and read an answer streamed as events, found by its id, or
a JSON one, each bounded, their failures in the relay's words, against a real aiohttp replica
on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
import pytest
from aiohttp import web

from gateway.errors import BadGateway, UnsafeHeader
from gateway.upstream.calls import UpstreamCallError, call
from gateway.upstream.pool import Pool
from gateway.upstream.relay import MAX_EVENT_BYTES, header_lines, read_whole
from gateway.upstream.replicas import Replica

Events = Callable[[str], list[bytes]]  # the request's id -> the chunks the replica streams
Start = Callable[[Events], Awaitable[str]]


Answer = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def replica() -> AsyncIterator[Callable[[Answer], Awaitable[str]]]:
    """Starts replicas that answer every POST with `answer`; stops them at the end."""
    runners: list[web.AppRunner] = []

    async def start(answer: Answer) -> str:
        app = web.Application()
        app.router.add_post("/mcp", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}/mcp"

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
def streaming(replica: Callable[[Answer], Awaitable[str]]) -> Start:
    """Replicas whose answer to every POST is an event stream of `events(request id)`."""

    async def start(events: Events) -> str:
        async def answer(request: web.Request) -> web.StreamResponse:
            request_id = orjson.loads(await request.read())["id"]
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for chunk in events(request_id):
                await response.write(chunk)
            await response.write_eof()
            return response

        return await replica(answer)

    return start


def event(message: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(message) + b"\n\n"


async def test_the_answer_is_the_event_that_carries_the_request_id(
    streaming: Start, pool: Pool
) -> None:
    url = await streaming(
        lambda own_id: [
            event({"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}),
            event({"jsonrpc": "2.0", "id": "another", "result": {"not": "ours"}}),
            event({"jsonrpc": "2.0", "id": own_id, "result": {"tools": []}}),
        ]
    )
    result = await call(pool, Replica("b", url), "tools/list", timeout_s=5)
    assert result == {"tools": []}


async def test_a_stream_that_ends_without_the_answer_fails_the_call(
    streaming: Start, pool: Pool
) -> None:
    url = await streaming(lambda own_id: [event({"jsonrpc": "2.0", "id": "another", "result": {}})])
    with pytest.raises(UpstreamCallError, match="the event stream ended without an answer"):
        await call(pool, Replica("b", url), "tools/list", timeout_s=5)


async def test_an_event_past_the_bound_fails_the_call_rather_than_escaping_it(
    streaming: Start, pool: Pool
) -> None:
    # One event that never ends, a little past the bound: the decoder refuses to hold it, and
    # the call fails with its own error (FrameTooLarge used to escape it, past callers that
    # catch UpstreamCallError: discovery, probes, listen pollers).
    chunk = b"x" * 65536
    whole = MAX_EVENT_BYTES // len(chunk) + 2
    url = await streaming(lambda own_id: [b"data: ", *([chunk] * whole)])
    with pytest.raises(UpstreamCallError, match="Bad gateway: backend 'b'"):
        await call(pool, Replica("b", url), "tools/list", timeout_s=5)


async def test_the_bound_is_the_callers(streaming: Start, pool: Pool) -> None:
    url = await streaming(lambda own_id: [b"data: " + b"x" * 4096 + b"\n\n"])
    body = orjson.dumps({"jsonrpc": "2.0", "id": "own", "method": "ping"})
    with pytest.raises(BadGateway, match="1024 bytes"):
        await read_whole(pool, Replica("b", url), "own", body, b"", 5, max_bytes=1024)


async def test_own_calls_share_the_pools_connections(
    replica: Callable[[Answer], Awaitable[str]], pool: Pool
) -> None:
    # The relay's pool carries taskgate's own calls too: two calls in turn, one connection.
    peers: list[object] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        own_id = orjson.loads(await request.read())["id"]
        return web.json_response({"jsonrpc": "2.0", "id": own_id, "result": {}})

    url = await replica(answer)
    for _ in range(2):
        assert await call(pool, Replica("b", url), "ping", timeout_s=5) == {}
    assert len(peers) == 2
    assert peers[0] == peers[1]


async def test_a_refused_connection_is_said_as_the_relay_says_it(pool: Pool) -> None:
    with pytest.raises(UpstreamCallError, match="tools/list: Backend 'b' is unreachable"):
        await call(pool, Replica("b", "http://127.0.0.1:9/mcp"), "tools/list", timeout_s=5)


async def test_an_answer_that_is_not_json_rpc_names_its_status(
    replica: Callable[[Answer], Awaitable[str]], pool: Pool
) -> None:
    # The SDK 1.x server's answer to a request without its session: a 400 in plain words.
    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.Response(status=400, text="Bad Request: Missing session ID")

    url = await replica(answer)
    with pytest.raises(UpstreamCallError, match="HTTP 400 without a JSON-RPC answer"):
        await call(pool, Replica("b", url), "server/discover", timeout_s=5)


async def test_no_answer_in_time_is_said_with_the_deadline(
    replica: Callable[[Answer], Awaitable[str]], pool: Pool
) -> None:
    release = asyncio.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.json_response({})

    url = await replica(answer)
    try:
        with pytest.raises(UpstreamCallError, match=r"did not answer within 0\.2 s"):
            await call(pool, Replica("b", url), "tasks/get", timeout_s=0.2)
    finally:
        release.set()


async def test_header_lines_refuse_a_value_that_could_split_the_request() -> None:
    assert header_lines({"X-Tenant": "acme"}) == b"X-Tenant: acme\r\n"
    with pytest.raises(UnsafeHeader, match="line break or NUL"):
        header_lines({"X-Tenant": "acme\r\nX-Admin: 1"})


@pytest.fixture
def answering(
    replica: Callable[[Answer], Awaitable[str]],
) -> Callable[[bytes, bool], Awaitable[str]]:
    """Replicas whose answer to every POST is `body` as JSON (`chunked`: without a
    Content-Length)."""

    async def start(body: bytes, chunked: bool) -> str:
        async def answer(request: web.Request) -> web.StreamResponse:
            await request.read()
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            if chunked:
                response.enable_chunked_encoding()
            else:
                response.content_length = len(body)
            await response.prepare(request)
            await response.write(body)
            await response.write_eof()
            return response

        return await replica(answer)

    return start


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_json_answer_past_the_replicas_max_answer_bytes_fails_the_call(
    answering: Callable[[bytes, bool], Awaitable[str]], chunked: bool, pool: Pool
) -> None:
    body = orjson.dumps({"jsonrpc": "2.0", "id": "x", "result": {"pad": "x" * 300_000}})
    url = await answering(body, chunked)
    with pytest.raises(UpstreamCallError, match="larger than 100000 bytes"):
        await call(pool, Replica("b", url, 100_000), "tasks/get", timeout_s=5)
    # Within the bound the same answer is read (its id is not checked for JSON answers).
    result = await call(pool, Replica("b", url, len(body)), "tasks/get", timeout_s=5)
    assert result == {"pad": "x" * 300_000}
