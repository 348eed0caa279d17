"""The emulated notifications/tasks, seen from the backend: one poller per task however many
streams watch it, never faster than the task's pollIntervalMs, and no call after the terminal
snapshot or once nobody watches (issue 13, item 4)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from tests.gateway.conftest import EchoUpstream
from tests.support.echo_upstream import SEEN, TASK_STATE
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.listen import listening
from tests.support.mcp import mcp_call, poll_until, result_of

WITHIN = 20.0
INTERVAL_MS = 300


@pytest.fixture
async def gateway(echo_upstream: EchoUpstream) -> AsyncIterator[RunningGateway]:
    config = gateway_config(
        {"echo": [echo_upstream.url]},
        [(["*"], "echo")],
        subscriptions={"min_poll_interval_ms": 50, "default_poll_interval_ms": 50},
    )
    async with serving(config) as running:
        yield running


def polls(echo: EchoUpstream, task_id: str) -> list[float]:
    """When the backend was asked tasks/get for `task_id`."""
    times = []
    for seen in echo.app[SEEN]:
        message = orjson.loads(seen["body"])
        if message.get("method") == "tasks/get" and message["params"].get("taskId") == task_id:
            times.append(seen["at"])
    return times


async def make_task(http: aiohttp.ClientSession, url: str, task_id: str) -> None:
    params = {"name": "make_task", "arguments": {"task_id": task_id}}
    answer = await mcp_call(http, url, "tools/call", params)
    assert result_of(answer.message)["taskId"] == task_id


async def event(stream: Any) -> dict[str, Any]:
    async with asyncio.timeout(WITHIN):
        message: dict[str, Any] = await stream.next()
        return message


async def test_two_streams_share_one_poller_that_keeps_the_tasks_pace_and_stops_at_the_end(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, gateway: RunningGateway
) -> None:
    await make_task(http, gateway.url, "paced")
    state = echo_upstream.app[TASK_STATE]
    state["paced"] = {"pollIntervalMs": INTERVAL_MS}
    watch = {"taskIds": ["paced"]}
    async with (
        listening(http, gateway.url, watch, id=1) as one,
        listening(http, gateway.url, watch, id=2) as two,
    ):
        for stream in (one, two):
            assert (await event(stream))["params"]["notifications"] == watch
            assert (await event(stream))["params"]["status"] == "working"
        assert gateway.state.listens.pollers == 1
        # It polls on, unchanged, and sends nothing for a task that did not move.
        await poll_until(
            lambda: counted(echo_upstream, "paced"), lambda seen: seen["calls"] >= 4, within=WITHIN
        )
        state["paced"] = {"pollIntervalMs": INTERVAL_MS, "status": "completed"}
        for stream in (one, two):
            assert (await event(stream))["params"]["status"] == "completed"
        # The poller made its last call before the terminal snapshot was sent.
        calls = polls(echo_upstream, "paced")
    async with asyncio.timeout(WITHIN):
        await gateway.state.listens.idle.wait()
    assert polls(echo_upstream, "paced") == calls  # none after the terminal snapshot
    gaps = [later - earlier for earlier, later in itertools.pairwise(calls)]
    assert len(gaps) >= 4
    assert min(gaps) >= INTERVAL_MS / 1000 * 0.95, gaps  # never faster (timer granularity)


async def counted(echo: EchoUpstream, task_id: str) -> dict[str, Any]:
    return {"calls": len(polls(echo, task_id))}


async def test_a_task_nobody_watches_any_more_is_not_polled(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, gateway: RunningGateway
) -> None:
    await make_task(http, gateway.url, "left")
    echo_upstream.app[TASK_STATE]["left"] = {"pollIntervalMs": 100}
    hub = gateway.state.listens
    async with listening(http, gateway.url, {"taskIds": ["left"]}, id=1) as stream:
        await event(stream)
        await event(stream)
        poller = hub._pollers["left"]  # the one polling for this stream
        assert poller.task is not None
        assert not poller.task.done()
    async with asyncio.timeout(WITHIN):
        await hub.idle.wait()  # the stream's end has run
    # Its poller was cancelled, not left to end on its own: no call can follow.
    assert poller.task.cancelled()
    assert not poller.watchers
