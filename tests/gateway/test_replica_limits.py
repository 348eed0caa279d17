"""What taskgate holds for a replica's answer and for a client's request is bounded, through the
whole gateway: a replica that never ends its head or answers too much gets 502 (counted against
it), and a request that would pass the process's budget of request bytes gets the retryable
error."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from tests.support.gateway import gateway_config, serving
from tests.support.mcp import build_request, mcp_headers

ids = itertools.count(7000)
Script = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def replica(script: Script) -> AsyncIterator[str]:
    """A replica on loopback that runs `script` for each request it reads (head and body),
    one after another on each connection; every connection is closed at the end."""
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            for _ in range(100):
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await script(await reader.readexactly(length), writer)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/mcp"
    finally:
        server.close()
        for writer in writers:
            writer.close()


async def endless_head(request: bytes, writer: asyncio.StreamWriter) -> None:
    # Measured before the bound: taskgate grew by 4.9 GB of RSS in 15 s, until the deadline.
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
    for n in range(200_000):  # 2.6 MB of header lines at most; the client closes long before
        writer.write(b"X-Field-%06d: v\r\n" % n)
        await writer.drain()


async def large_answer(request: bytes, writer: asyncio.StreamWriter) -> None:
    """Discovery as a backend with tool `t`; tools/call `t` answers 200 KB."""
    message = orjson.loads(request)
    result: dict[str, Any] = {"content": [], "pad": "x" * 200_000}
    if message["method"] == "server/discover":
        result = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}
    elif message["method"] == "tools/list":
        result = {"tools": [{"name": "t", "inputSchema": {"type": "object"}}]}
    body = orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % len(body)
    )
    writer.write(body)
    await writer.drain()


async def poll(condition: Callable[[], bool]) -> None:
    """A bounded poll: the server signals nothing a test could await."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not so within 5 s")


def call(**arguments: Any) -> dict[str, Any]:
    return build_request("tools/call", {"name": "t", "arguments": arguments}, id=next(ids))


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    headers = mcp_headers(body["method"], body["params"])
    async with http.post(url, data=orjson.dumps(body), headers=headers) as response:
        return response.status, response.headers, orjson.loads(await response.read())


@pytest.mark.parametrize(
    ("script", "why"),  # the replica answers taskgate's own probe the same way
    [(endless_head, "more than 100 header fields"), (large_answer, "larger than 100000 bytes")],
    ids=["endless-head", "answer-over-max_answer_bytes"],
)
async def test_a_replica_answering_past_its_bounds_is_502_and_counted_against_it(
    http: aiohttp.ClientSession, script: Script, why: str
) -> None:
    async with replica(script) as url:
        config = gateway_config(
            {"b": [url]},
            [(["t"], "b")],
            backend_options={"b": {"max_answer_bytes": 100_000, "timeout_s": 60}},
            health={"interval_s": 3600, "unhealthy_after": 100},
        )
        async with serving(config) as gateway:
            (only,) = gateway.state.backends["b"].replicas
            await poll(lambda: only.url in gateway.state.health._states)  # probed at start
            states = gateway.state.health._states
            failures = states[only.url].failures
            loop = asyncio.get_running_loop()
            for _ in range(2):
                began = loop.time()
                status, _, message = await post(http, gateway.url, call())
                assert status == 502
                assert why in message["error"]["message"]
                assert loop.time() - began < 30  # at the bound, not at the 60 s deadline
            assert states[only.url].failures == failures + 2


async def test_a_request_past_the_budget_of_request_bytes_is_the_retryable_error(
    http: aiohttp.ClientSession,
) -> None:
    async def never(request: bytes, writer: asyncio.StreamWriter) -> None:
        assert b"tools/call" not in request, "no call may reach the replica"

    async with replica(never) as url:
        config = gateway_config({"b": [url]}, [(["t"], "b")], listen={"max_buffered_bytes": 65_536})
        async with serving(config) as gateway:
            port = int(gateway.url.split(":")[2].split("/")[0])
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                # A slow sender holds 60,000 of the 65,536 bytes.
                body = call(text="x" * 61_000)
                head = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                head += b"".join(
                    f"{name}: {value}\r\n".encode()
                    for name, value in mcp_headers("tools/call", body["params"]).items()
                )
                wire = orjson.dumps(body)
                writer.write(head + b"Content-Length: %d\r\n\r\n" % len(wire) + wire[:60_000])
                await writer.drain()
                await poll(lambda: gateway.server.buffered >= 60_000)
                status, headers, message = await post(http, gateway.url, call(text="y" * 8_000))
                assert status == 503
                assert headers["Retry-After"] == "1"
                assert message["error"]["code"] == -32603
                assert message["error"]["data"] == {"retryable": True}
                assert "request bytes" in message["error"]["message"]
            finally:
                writer.close()
