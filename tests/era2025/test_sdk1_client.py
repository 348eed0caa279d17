"""A 2025-era client (the Python SDK 1.x's ClientSession, tests/era2025/py_sdk1_client.py)
through taskgate's front door to servers that speak only the 2025 era sees what it sees
reaching them direct: the handshake, ping, lists, calls, a question the server asks during a
call (elicitation, answered by the client's callback), prompts, resources, logging levels,
resource subscriptions, and 2025-11-25 tasks (one asking through its tasks/result stream)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.support.era2025 import MCP1_PYTHON, ROUTES, Era2025Process, TSSDK1Process
from tests.support.gateway import gateway_config, serving
from tests.support.node import NodeProject
from tests.support.procs import REPO_ROOT

CLIENT = REPO_ROOT / "tests" / "era2025" / "py_sdk1_client.py"
CLIENT_TIMEOUT_S = 60.0


async def run_client(url: str) -> dict[str, Any]:
    """What the client printed against `url`; the test fails if it failed."""
    proc = await asyncio.create_subprocess_exec(
        str(MCP1_PYTHON),
        str(CLIENT),
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), CLIENT_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"py_sdk1_client.py did not end within {CLIENT_TIMEOUT_S} s", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(f"py_sdk1_client.py failed: {err.decode()[-2000:]}", pytrace=False)
    printed: dict[str, Any] = json.loads(out)
    return printed


async def test_a_2025_client_cannot_tell_taskgate_from_the_server(
    stateful: Era2025Process,
) -> None:
    direct = await run_client(stateful.url)
    if stateful.name == "ts-sdk1":
        # Its 2025-11-25 tasks: run, followed, cancelled, listed, and one that asks.
        assert direct["tasks"] is True
        assert direct["task"][:2] == ["working", "completed"]
        assert direct["task"][2]["content"][0]["text"] == "report of 0.2s by ts-sdk1"
        assert (direct["cancelled"], direct["listed"]) == ("cancelled", ["cancelled", "completed"])
        assert direct["approved"]["content"][0]["text"] == "yes"
        assert direct["asked"] == ["Proceed?", "approve step 1?"]
        # It serves logging (the level set filters what it sends) and subscriptions (told of
        # an update while subscribed only).
        assert (direct["setLevel"], direct["logs"]) == ("ok", [["error", "shout"]])
        assert direct["updates"] == ["note://readme"]
        told = [t["content"][0]["text"] for t in direct["touched"]]
        assert told == ["told", "nobody listens"]
    else:  # FastMCP 1.x serves neither logging/setLevel nor subscriptions nor tasks
        assert (direct["setLevel"], direct["logs"]) == (-32601, [])
        assert (direct["subscribe"], direct["updates"], direct["tasks"]) == (False, [], False)
        assert direct["asked"] == ["Proceed?"]
    config = gateway_config({"old": [stateful.url]}, ROUTES, legacy={"enabled": True})
    async with serving(config) as gateway:
        through = await run_client(gateway.url)
    assert through == direct


async def test_a_call_moved_to_polling_is_answered_once_the_client_resumes(
    node_project: NodeProject,
) -> None:
    """A server that keeps its sessions' events closes a call's stream before its answer
    (2025-11-25 polling); the client resumes with Last-Event-ID, through taskgate as direct."""
    server = TSSDK1Process("ts-sdk1", node_project.require(), resumable=True)
    try:
        server.start()
        direct = await run_client(server.url)
        assert direct["polled"]["content"][0]["text"] == "polled"
        config = gateway_config({"old": [server.url]}, ROUTES, legacy={"enabled": True})
        async with serving(config) as gateway:
            through = await run_client(gateway.url)
        assert through == direct
    finally:
        server.cleanup()
