"""What listen streams owe their clients is bounded for the whole process
(subscriptions.max_pending_bytes): a client that never reads is cut once the bound is reached,
a client that reads keeps getting its events, and nothing stays counted (issue 23, item 8)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aiohttp
import orjson
import pytest

from tests.gateway.conftest import EchoUpstream
from tests.support.echo_upstream import TASK_STATE
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.listen import listening, next_event
from tests.support.mcp import build_request, mcp_call, mcp_headers, result_of

WITHIN = 20.0
LIMIT = 3 * 1024 * 1024
TASKS = [f"big-{n}" for n in range(8)]  # watched by the stream that never reads
READ = TASKS[:2]  # watched by the one that reads: it never owes near LIMIT
MESSAGE_BYTES = 384 * 1024  # each snapshot: the eight owed at once, and one being sent, pass LIMIT


@pytest.fixture
async def gateway(echo_upstream: EchoUpstream) -> AsyncIterator[RunningGateway]:
    config = gateway_config(
        {"echo": [echo_upstream.url]},
        [(["*"], "echo")],
        subscriptions={
            "min_poll_interval_ms": 50,
            "default_poll_interval_ms": 50,
            "max_pending_bytes": LIMIT,
        },
    )
    async with serving(config) as running:
        yield running


def move_tasks(echo: EchoUpstream, turn: int) -> None:
    """Every task's next snapshot differs from its last, and is MESSAGE_BYTES long."""
    for task_id in TASKS:
        echo.app[TASK_STATE][task_id] = {"statusMessage": str(turn % 10) * MESSAGE_BYTES}


async def never_reads(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A listen for TASKS whose client sends the request and then reads nothing (a small
    receive buffer, so that taskgate's writes stop soon)."""
    parts = urlsplit(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (parts.hostname, parts.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    body = orjson.dumps(
        build_request("subscriptions/listen", {"notifications": {"taskIds": TASKS}}, id="slow")
    )
    headers = mcp_headers("subscriptions/listen", orjson.loads(body)["params"])
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    writer.write(
        f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n{head}"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    return reader, writer


async def test_a_client_that_never_reads_is_cut_at_the_bound_and_a_reader_keeps_its_events(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, gateway: RunningGateway
) -> None:
    for task_id in TASKS:
        answer = await mcp_call(
            http,
            gateway.url,
            "tools/call",
            {"name": "make_task", "arguments": {"task_id": task_id}},
        )
        assert result_of(answer.message)["taskId"] == task_id
    hub = gateway.state.listens
    pending = hub.pending
    move_tasks(echo_upstream, 0)
    reader, writer = await never_reads(gateway.url)
    most = 0
    try:
        async with listening(http, gateway.url, {"taskIds": READ}, id="reads") as reads:
            assert (await next_event(reads))["params"]["notifications"] == {"taskIds": READ}
            turn = 0
            # The tasks move until the stream that never reads has been cut; the reader takes
            # every snapshot of every turn meanwhile.
            while pending.cuts == 0:
                turn += 1
                assert turn < 200, "the stream that never reads was never cut"
                seen: set[str] = set()
                while len(seen) < len(READ):
                    event = await next_event(reads)
                    most = max(most, pending.held)
                    if event["params"]["statusMessage"][0] == str((turn - 1) % 10):
                        seen.add(event["params"]["taskId"])
                move_tasks(echo_upstream, turn)
            assert pending.cuts == 1
            assert hub.streams >= 1
            # The reader goes on: the next turn reaches it whole.
            move_tasks(echo_upstream, turn + 1)
            seen = set()
            while len(seen) < len(READ):
                event = await next_event(reads)
                most = max(most, pending.held)
                if event["params"]["statusMessage"][0] == str((turn + 1) % 10):
                    seen.add(event["params"]["taskId"])
        # The cut stream's connection ends once what was sent is taken, without the chunked
        # end: it must not look complete to its client.
        async with asyncio.timeout(WITHIN):
            rest = await reader.read()  # up to the end of the connection
        assert rest.startswith(b"HTTP/1.1 200")
        assert not rest.endswith(b"0\r\n\r\n")
    finally:
        writer.close()
    assert most <= LIMIT
    async with asyncio.timeout(WITHIN):
        await hub.idle.wait()  # every stream ended, every poller stopped
    assert pending.held == 0
    assert not pending.owing
