"""limits.polling against real report replicas (FastMCP's tasks advertise pollIntervalMs 5000):
a tasks/get sooner than tolerance x pollIntervalMs after the caller's last answered one is
answered from that answer without asking the owner (snapshot) or refused with 429 (refuse);
another principal never gets it; a tasks/cancel drops it; with polling off every tasks/get goes
to the owner.

Which replica answered is read from taskgate's own request metrics (the backend label: the
configured backend, or "taskgate" for an answer given here) and, on the backend's side, from
lastUpdatedAt, which FastMCP stamps with the time of each read."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.gateway.conftest import REPORT_TOOLS
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.mcp import Answer, mcp_call, result_of
from tests.support.procs import BackendProcess

REPORT = {"name": "generate_report", "arguments": {"size": "small"}}
POLL_INTERVAL_MS = 5000  # what FastMCP 4.1.4's tasks advertise


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def polling_config(
    issuer: Issuer, backends: list[BackendProcess], sharing: str = "principal", **polling: Any
) -> Any:
    return gateway_config(
        {"reports": [b.url for b in backends]},
        [(REPORT_TOOLS, "reports")],
        auth=jwt_auth(issuer, task_sharing=sharing),
        limits={"polling": polling} if polling else {},
    )


async def create(http: aiohttp.ClientSession, url: str, token: str) -> str:
    """A report task (it parks in input_required); its id."""
    answer = await mcp_call(http, url, "tools/call", REPORT, token=token)
    assert answer.status == 200, answer.raw
    task_id: str = result_of(answer.message)["taskId"]
    return task_id


async def task_get(
    http: aiohttp.ClientSession, url: str, token: str, task_id: str, request_id: int
) -> Answer:
    return await mcp_call(http, url, "tasks/get", {"taskId": task_id}, token=token, id=request_id)


def answered(gateway: RunningGateway, backend: str, method: str = "tasks/get") -> int:
    """The requests of `method` the request metrics say `backend` answered."""
    requests = gateway.state.observer.metrics.requests
    return sum(n for (m, _, _, b), n in requests.items() if (m, b) == (method, backend))


async def test_a_tasks_get_too_soon_is_answered_from_the_callers_last_answer(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    ann, bob = issuer.token("acme", "ann"), issuer.token("acme", "bob")
    config = polling_config(issuer, report_backends, mode="snapshot", tolerance=1)
    async with serving(config) as gw:
        task_id = await create(http, gw.url, ann)
        first = await task_get(http, gw.url, ann, task_id, 101)
        second = await task_get(http, gw.url, ann, task_id, 102)
        assert (first.status, second.status) == (200, 200), second.raw
        assert result_of(first.message)["pollIntervalMs"] == POLL_INTERVAL_MS
        assert (first.message["id"], second.message["id"]) == (101, 102)
        assert result_of(second.message) == result_of(first.message)
        assert (answered(gw, "reports"), answered(gw, "taskgate")) == (1, 1)
        # Another principal's tasks/get goes its own way (here: not its task), never to ann's
        # snapshot.
        foreign = await task_get(http, gw.url, bob, task_id, 103)
        assert foreign.message["error"]["code"] == -32602, foreign.raw
        assert answered(gw, "taskgate") == 1
        # A tasks/cancel drops the snapshot: the next tasks/get is the owner's answer.
        cancel = await mcp_call(http, gw.url, "tasks/cancel", {"taskId": task_id}, token=ann)
        assert cancel.status == 200, cancel.raw
        after = await task_get(http, gw.url, ann, task_id, 104)
        assert result_of(after.message)["status"] == "cancelled"
        assert (answered(gw, "reports"), answered(gw, "taskgate")) == (2, 1)


async def test_each_callers_first_tasks_get_goes_to_the_owner(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    """Two principals of a tenant that shares tasks: the second's first read is its own."""
    ann, bob = issuer.token("acme", "ann"), issuer.token("acme", "bob")
    config = polling_config(issuer, report_backends, "tenant", mode="snapshot", tolerance=1)
    async with serving(config) as gw:
        task_id = await create(http, gw.url, ann)
        mine = await task_get(http, gw.url, ann, task_id, 201)
        theirs = await task_get(http, gw.url, bob, task_id, 202)
        assert result_of(theirs.message)["taskId"] == task_id
        assert (
            result_of(mine.message)["lastUpdatedAt"] != result_of(theirs.message)["lastUpdatedAt"]
        ), "bob's read is a read of the owner, not ann's snapshot"
        assert (answered(gw, "reports"), answered(gw, "taskgate")) == (2, 0)


async def test_a_tasks_get_too_soon_is_refused_in_mode_refuse(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    ann = issuer.token("acme", "ann")
    config = polling_config(issuer, report_backends, mode="refuse", tolerance=1)
    async with serving(config) as gw:
        task_id = await create(http, gw.url, ann)
        assert (await task_get(http, gw.url, ann, task_id, 301)).status == 200
        refused = await task_get(http, gw.url, ann, task_id, 302)
        assert refused.status == 429, refused.raw
        error = refused.message["error"]
        assert (refused.message["id"], error["code"]) == (302, -32603)
        assert (error["data"]["retryable"], error["data"]["limit"]) == (True, "polling")
        wait_ms = error["data"]["retryAfterMs"]
        assert 1 <= wait_ms <= POLL_INTERVAL_MS
        assert int(refused.headers["Retry-After"]) == math.ceil(wait_ms / 1000)
        assert answered(gw, "reports") == 1


async def test_with_polling_off_every_tasks_get_goes_to_the_owner(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    ann = issuer.token("acme", "ann")
    async with serving(polling_config(issuer, report_backends)) as gw:
        assert gw.state.config.limits.polling.mode == "off"
        task_id = await create(http, gw.url, ann)
        first = await task_get(http, gw.url, ann, task_id, 401)
        second = await task_get(http, gw.url, ann, task_id, 402)
        assert (first.status, second.status) == (200, 200)
        assert (
            result_of(first.message)["lastUpdatedAt"] != result_of(second.message)["lastUpdatedAt"]
        )
        assert (answered(gw, "reports"), answered(gw, "taskgate")) == (2, 0)
