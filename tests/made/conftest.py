"""Fixtures for the tasks taskgate runs itself: a backend without tasks (backends/plain.py) and
taskgate configured to run its calls as tasks."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gateway.config import Config
from tests.support.gateway import gateway_config
from tests.support.mcp import JsonObject, mcp_post, result_of

PLAIN_TOOLS = ["work", "release", "stats", "quick", "approve", "approve_both", "big", "broken"]
_labels = itertools.count(1)
_ids = itertools.count(7_000_000)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def label() -> str:
    """A `work` label no other test uses."""
    return f"job-{next(_labels)}"


def next_id() -> int:
    return next(_ids)


def made_config(
    replicas: list[str],
    *,
    mode: str = "always",
    store: str = "sqlite:///:memory:",
    auth: dict[str, Any] | None = None,
    **task: Any,
) -> Config:
    """taskgate in front of the plain backend, its tools run as tasks taskgate holds
    (`release` and `stats`, the tests' own levers, never)."""
    levers = {"tools": ["release", "stats"], "backend": "plain"}
    tasks = {
        "tools": [tool for tool in PLAIN_TOOLS if tool not in levers["tools"]],
        "backend": "plain",
        "task": {"mode": mode, **task},
    }
    made = {"lease_s": 3}
    sections: dict[str, Any] = {"tasks": {"made": made}}
    if auth is not None:
        sections["auth"] = auth
    return gateway_config({"plain": replicas}, [levers, tasks], store=store, **sections)


def _bearer(token: str | None) -> dict[str, str] | None:
    return {"Authorization": f"Bearer {token}"} if token else None


async def call(
    http: aiohttp.ClientSession,
    url: str,
    tool: str,
    tasks: bool = True,
    token: str | None = None,
    **arguments: Any,
) -> tuple[int, JsonObject]:
    """tools/call as a client sends it (the Tasks extension declared unless `tasks` is off)."""
    params = {"name": tool, "arguments": arguments}
    return await mcp_post(
        http, url, "tools/call", params, id=next_id(), tasks=tasks, headers=_bearer(token)
    )


async def task_method(
    http: aiohttp.ClientSession,
    url: str,
    method: str,
    task_id: str,
    token: str | None = None,
    **params: Any,
) -> JsonObject:
    status, response = await mcp_post(
        http, url, method, {"taskId": task_id, **params}, id=next_id(), headers=_bearer(token)
    )
    assert status == 200, response
    return response


async def stats(http: aiohttp.ClientSession, url: str, job: str) -> dict[str, int]:
    _, response = await call(http, url, "stats", label=job)
    counted: dict[str, int] = result_of(response)["structuredContent"]
    return counted
