"""taskgate's own calls to a replica (discovery, probes, listen pollers, the 2025-era
initialize) read an answer streamed as events, found by its id, or a JSON one, each bounded,
against a real aiohttp replica on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.upstream.calls import MAX_SSE_FRAME, UpstreamCallError, call, final_sse_message
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


async def test_the_answer_is_the_event_that_carries_the_request_id(streaming: Start) -> None:
    url = await streaming(
        lambda own_id: [
            event({"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}),
            event({"jsonrpc": "2.0", "id": "another", "result": {"not": "ours"}}),
            event({"jsonrpc": "2.0", "id": own_id, "result": {"tools": []}}),
        ]
    )
    async with aiohttp.ClientSession() as session:
        result = await call(session, Replica("b", url), "tools/list", timeout_s=5)
    assert result == {"tools": []}


async def test_a_stream_that_ends_without_the_answer_fails_the_call(streaming: Start) -> None:
    url = await streaming(lambda own_id: [event({"jsonrpc": "2.0", "id": "another", "result": {}})])
    async with aiohttp.ClientSession() as session:
        with pytest.raises(UpstreamCallError, match="ClientPayloadError"):
            await call(session, Replica("b", url), "tools/list", timeout_s=5)


async def test_an_event_past_the_bound_fails_the_call_rather_than_escaping_it(
    streaming: Start,
) -> None:
    # One event that never ends, a little past the bound: the decoder refuses to hold it, and
    # the call fails with its own error (FrameTooLarge used to escape it, past callers that
    # catch UpstreamCallError: discovery, probes, listen pollers).
    chunk = b"x" * 65536
    whole = MAX_SSE_FRAME // len(chunk) + 2
    url = await streaming(lambda own_id: [b"data: ", *([chunk] * whole)])
    async with aiohttp.ClientSession() as session:
        with pytest.raises(UpstreamCallError, match="ClientPayloadError"):
            await call(session, Replica("b", url), "tools/list", timeout_s=5)


async def test_the_bound_is_the_callers(streaming: Start) -> None:
    url = await streaming(lambda own_id: [b"data: " + b"x" * 4096 + b"\n\n"])
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=orjson.dumps({"id": "own"})) as response,
    ):
        with pytest.raises(aiohttp.ClientPayloadError, match="passed 1024 bytes"):
            await final_sse_message(response, "own", max_frame_bytes=1024)


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
    answering: Callable[[bytes, bool], Awaitable[str]], chunked: bool
) -> None:
    body = orjson.dumps({"jsonrpc": "2.0", "id": "x", "result": {"pad": "x" * 300_000}})
    url = await answering(body, chunked)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(UpstreamCallError, match="ClientPayloadError"):
            await call(session, Replica("b", url, 100_000), "tasks/get", timeout_s=5)
        # Within the bound the same answer is read (its id is not checked for JSON answers).
        result = await call(session, Replica("b", url, len(body)), "tasks/get", timeout_s=5)
    assert result == {"pad": "x" * 300_000}
