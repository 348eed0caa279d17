"""Shared fixtures: real report backends, the plain backend and a throwaway redis-server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from gateway.upstream.pool import Pool
from tests.support.hypothesis_profiles import load_profiles
from tests.support.issuer import Issuer, running_issuer
from tests.support.procs import (
    BackendProcess,
    PlainBackendProcess,
    RedisProcess,
    start_backends,
    stop_all,
)

# Before any test module is imported: @settings(...) takes what it leaves unset from the
# profile loaded when the decorator runs.
load_profiles()


@pytest.fixture(scope="session")
def report_backends() -> Iterator[list[BackendProcess]]:
    """Two report replicas, "r1" and "r2", each with its own memory:// task store."""
    backends = start_backends(["r1", "r2"])
    try:
        yield backends
    finally:
        stop_all(backends)


@pytest.fixture(scope="session")
def plain_backend() -> Iterator[PlainBackendProcess]:
    """One replica of the plain backend, for the whole session (tests use labels of their own)."""
    backend = PlainBackendProcess("p1")
    try:
        backend.launch()
        backend.wait_ready(30.0)
        yield backend
    finally:
        stop_all([backend])


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisProcess]:
    """One redis-server for the whole session."""
    with RedisProcess() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisProcess) -> str:
    """The session redis, emptied before the test."""
    redis_server.flushall()
    return redis_server.url


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    """The relay's pool, as taskgate's own calls use it; every connection closed at the end."""
    made = Pool()
    yield made
    await made.close()


@pytest.fixture
async def issuer() -> AsyncIterator[Issuer]:
    """A token issuer with one ES256 key, its JWKS served on loopback."""
    async with running_issuer("ES256") as running:
        yield running
