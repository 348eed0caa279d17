"""The 2025-era test servers as fixtures: the Node project of the TypeScript SDK 1.x once per
module, then a server of each kind per test, and taskgate in front of one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from tests.support.era2025 import (
    ROUTES,
    SERVERS,
    TS1_DIR,
    TS_SDK_PACKAGE,
    Era2025Process,
    started,
)
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.node import NodeProject, prepare_node_project


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node_project() -> NodeProject:
    """Node checked and the TypeScript SDK 1.x installed, once for the module."""
    return await prepare_node_project(TS1_DIR, [TS_SDK_PACKAGE])


@pytest.fixture(params=SERVERS)
def sdk1(request: pytest.FixtureRequest, node_project: NodeProject) -> Iterator[Era2025Process]:
    """Each kind of server in turn."""
    with started(request.param, node_project) as server:
        yield server


@pytest.fixture(params=[s for s in SERVERS if not s.endswith("-stateless")])
def stateful(request: pytest.FixtureRequest, node_project: NodeProject) -> Iterator[Era2025Process]:
    """Each kind of server that keeps sessions, in turn."""
    with started(request.param, node_project) as server:
        yield server


@pytest.fixture
async def gateway(sdk1: Era2025Process) -> AsyncIterator[RunningGateway]:
    """taskgate in front of `sdk1`, as backend "old"."""
    async with serving(gateway_config({"old": [sdk1.url]}, ROUTES)) as running:
        yield running
