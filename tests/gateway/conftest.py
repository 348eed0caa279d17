"""Fixtures for taskgate in front of real backends on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.echo_upstream import SEEN, make_echo_app
from tests.support.gateway import gateway_config, running_gateway
from tests.support.mcp import build_request, poll_until, post_raw
from tests.support.procs import BackendProcess

REPORT_TOOLS = ["generate_report", "report_*", "echo", "whoami", "slow_count", "stats"]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def r1(report_backends: list[BackendProcess]) -> BackendProcess:
    """The first report replica, talked to directly."""
    return report_backends[0]


@pytest.fixture
def r2(report_backends: list[BackendProcess]) -> BackendProcess:
    return report_backends[1]


@pytest.fixture
async def gateway_url(report_backends: list[BackendProcess]) -> AsyncIterator[str]:
    """taskgate in front of the two report replicas, every tool of theirs routed."""
    config = gateway_config(
        {"reports": [b.url for b in report_backends]}, [(REPORT_TOOLS, "reports")]
    )
    async with running_gateway(config) as url:
        yield url


@dataclass
class EchoUpstream:
    url: str
    app: web.Application


@pytest.fixture
async def echo_upstream() -> AsyncIterator[EchoUpstream]:
    app = make_echo_app()
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield EchoUpstream(url=str(server.make_url("/mcp")), app=app)
    finally:
        await server.close()


@pytest.fixture
async def echo_gateway_url(echo_upstream: EchoUpstream) -> AsyncIterator[str]:
    config = gateway_config({"echo": [echo_upstream.url]}, [(["*"], "echo")])
    async with running_gateway(config) as url:
        yield url


async def leave_mid_call(http: aiohttp.ClientSession, url: str, upstream: EchoUpstream) -> None:
    """A client that sends a tools/call the echo upstream holds ("hang"), and closes its
    connection once the upstream has it."""
    seen = upstream.app[SEEN]
    body = build_request("tools/call", {"name": "hang"}, id=next(_leaving_ids))
    leaving = asyncio.ensure_future(post_raw(http, url, body))

    async def hung() -> int:
        return sum(orjson.loads(s["body"])["method"] == "tools/call" for s in seen)

    await poll_until(hung, lambda calls: calls == 1, within=10)
    leaving.cancel()  # the client closes its connection mid-call
    with contextlib.suppress(asyncio.CancelledError):
        await leaving
    assert leaving.cancelled()


_leaving_ids = itertools.count(90_000)
