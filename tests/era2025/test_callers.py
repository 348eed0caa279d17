"""The callers' sessions table against a real stateful 2025-era server (the Python SDK 1.x): a
reload that removes a replica ends its idle sessions at once, and a busy one only when its last
call ends, never under a call."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from gateway.bridge import own_session
from gateway.bridge.callers import CallerSessions, caller_of
from gateway.bridge.own_session import Opened
from gateway.config import BackendConfig
from gateway.upstream.calls import UpstreamCallError
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend, Replica
from tests.support.era2025 import PySDK1Process
from tests.support.mcp import poll_until


@pytest.fixture
def server() -> Iterator[PySDK1Process]:
    started = PySDK1Process("py-sdk1").start()
    try:
        yield started
    finally:
        started.cleanup()


@pytest.fixture
async def sessions(server: PySDK1Process, pool: Pool) -> AsyncIterator[CallerSessions]:
    backend = Backend.from_config("old", BackendConfig(replicas=(server.url,), era="2025"))
    made = CallerSessions(pool, {"old": backend})
    yield made
    await made.close()


async def known(pool: Pool, replica: Replica, opened: Opened) -> bool:
    """Whether the server still serves the session: a tools/list on it answers (one it ended
    answers 404, or, ended by a DELETE, a stream without an answer: the Python SDK 1.x)."""
    try:
        await own_session.ask(pool, replica, opened, {}, "tools/list", {}, 5.0)
    except UpstreamCallError:
        return False
    return True


async def test_a_removed_replicas_busy_session_ends_when_its_last_call_does(
    sessions: CallerSessions, pool: Pool
) -> None:
    (backend,) = sessions._backends.values()
    (replica,) = backend.replicas
    busy, _ = caller_of("acme", "alice", {})
    idle, _ = caller_of("acme", "bob", {})
    in_flight = await sessions.acquire(replica, busy, {}, None)
    assert await sessions.acquire(replica, busy, {}, None) is in_flight  # two calls on it
    left_alone = await sessions.acquire(replica, idle, {}, None)
    sessions.release(replica, idle, left_alone)
    sessions.reconfigure({})  # a reload took the replica out
    await poll_until(lambda: known(pool, replica, left_alone), lambda k: not k)
    assert await known(pool, replica, in_flight)  # its calls still run there
    sessions.release(replica, busy, in_flight)
    assert await known(pool, replica, in_flight)  # one of them does
    sessions.release(replica, busy, in_flight)
    await poll_until(lambda: known(pool, replica, in_flight), lambda k: not k)
    assert sessions.count(replica) == 0
