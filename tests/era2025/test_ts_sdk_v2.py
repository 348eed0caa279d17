"""The TypeScript SDK v2 client (`@modelcontextprotocol/client`, tests/clients/ts) as a
2026-07-28 client of the 2025-era test servers through taskgate: it connects by
server/discover, lists and calls, and its multi-round-trip driver answers a server's questions
(`input_required`) through its elicitation handler. tests/clients/ts/bridge.mjs is the client;
without Node.js 20 or later these tests fail, they do not skip."""

from __future__ import annotations

import json

import pytest
import pytest_asyncio

from tests.support.era2025 import ROUTES, Era2025Process
from tests.support.gateway import gateway_config, serving
from tests.support.node import NodeProject, prepare_node_project, run_process
from tests.support.procs import REPO_ROOT

TS_DIR = REPO_ROOT / "tests" / "clients" / "ts"
CLIENT_TIMEOUT_S = 60.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def ts_client() -> NodeProject:
    return await prepare_node_project(TS_DIR, ["@modelcontextprotocol/client"])


async def test_the_ts_sdk_client_lists_calls_and_answers_questions(
    stateful: Era2025Process, ts_client: NodeProject
) -> None:
    """Against the stateful servers: a stateless one has no session to take an answer in."""
    async with serving(gateway_config({"old": [stateful.url]}, ROUTES)) as gateway:
        argv = [ts_client.require(), "bridge.mjs", gateway.url]
        finished = await run_process(argv, cwd=TS_DIR, limit_s=CLIENT_TIMEOUT_S)
    if not finished.ok:
        pytest.fail(f"bridge.mjs failed: {finished.describe()}", pytrace=False)
    out = json.loads(finished.stdout)
    assert out["discover"]["supportedVersions"] == ["2026-07-28"]
    assert {"add", "confirm", "survey"} <= set(out["tools"])
    assert [block["text"] for block in out["add"]["content"]] == ["42"]
    assert [block["text"] for block in out["survey"]["content"]] == ["yes,no"]
    assert out["asked"] == ["first?", "second?"]
