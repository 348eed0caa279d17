"""A request takes its in-flight slot once its body has arrived: clients that trickle a body
hold connections, never the slots other clients' requests need."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import aiohttp
import orjson

from tests.support.gateway import gateway_config, serving
from tests.support.mcp import mcp_post, result_of
from tests.support.procs import BackendProcess

DECLARED = 170  # what each slow sender announces; it sends half of it
SENT = DECLARED // 2


def slow_head(port: int, *, expect: bool) -> bytes:
    lines = [
        "POST /mcp HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        "Accept: application/json, text/event-stream",
        "MCP-Protocol-Version: 2026-07-28",
        "Mcp-Method: tools/call",
        "Mcp-Name: whoami",
        f"Content-Length: {DECLARED}",
    ]
    if expect:
        lines.append("Expect: 100-continue")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_slow_senders_hold_no_slot_and_each_gets_408_in_time(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess]
) -> None:
    config = gateway_config(
        {"reports": [b.url for b in report_backends]},
        [(["whoami"], "reports")],
        listen={"max_in_flight": 4, "read_timeout_s": 2},
    )
    async with serving(config) as gateway:
        port = urlsplit(gateway.url).port
        assert port is not None
        senders: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            # Six slow senders for four slots. Four ask for 100-continue, which taskgate sends
            # when their handler starts reading the body: then each is provably past the point
            # where it used to take a slot. Two send head and half a body at once, as measured.
            for expect in (True, True, True, True, False, False):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                senders.append((reader, writer))
                writer.write(slow_head(port, expect=expect))
                if expect:
                    async with asyncio.timeout(10):
                        interim = await reader.readuntil(b"\r\n\r\n")
                    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
                writer.write(b"{" + b" " * (SENT - 1))
                await writer.drain()
            assert gateway.state.coordinator.in_flight == 0

            # A new well-formed request is served at once.
            status, response = await mcp_post(
                http, gateway.url, "tools/call", {"name": "whoami", "arguments": {}}, id=1
            )
            assert status == 200
            assert result_of(response)["structuredContent"]["replica"] in ("r1", "r2")

            # Each slow sender is told 408 once its read timeout passes, and the connection ends.
            for reader, _ in senders:
                async with asyncio.timeout(15):
                    raw = await reader.read()
                head, _, body = raw.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 408 ")
                assert orjson.loads(body)["error"]["code"] == -32600
            assert gateway.state.coordinator.in_flight == 0
        finally:
            for _, writer in senders:
                writer.close()
                await writer.wait_closed()
