"""Fixtures of the microbenchmarks: a private event loop, a redis-server, keys and tokens."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from gateway.auth.keys import VerificationKey
from gateway.auth.verify import Rules
from tests.support.issuer import AUDIENCE, ISSUER, Issuer, SigningKey, new_key
from tests.support.procs import RedisProcess

T = TypeVar("T")

ALGS = ("ES256", "RS256")
TOKEN_LIFETIME_S = 3600  # far longer than a run: no token expires while measured
RULES = Rules(
    issuer=ISSUER,
    audience=AUDIENCE,
    algorithms=frozenset(ALGS),
    tenant_claim="tenant",
    principal_claim="sub",
    leeway_s=30.0,
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "large: fills a store with 1,000,000 routes (deselect with -m 'not large')"
    )


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """The loop `taskgate run` serves on (uvloop when installed), so async cases cost here
    what they cost there; asyncio's own where the gateway does not choose one."""
    try:
        from gateway.process.workers import loop_factory
    except ImportError:
        return asyncio.new_event_loop
    return loop_factory()


def pytest_report_header(config: pytest.Config) -> str:
    loop = _loop_factory()()
    try:
        return f"event loop of the async cases: {type(loop).__module__}.{type(loop).__name__}"
    finally:
        loop.close()


class Loop:
    """One event loop for the whole session, driven from synchronous benchmark callables."""

    def __init__(self) -> None:
        self.loop = _loop_factory()()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()


def run_inline(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (no I/O on its path) without an event loop, as an
    `await` inside the gateway's running loop runs it: no trip through a loop is added. If it
    does suspend it is closed and RuntimeError says so; such a path needs Loop.run."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coro.close()
    raise RuntimeError("the coroutine suspended: it needs an event loop (Loop.run)")


@pytest.fixture(scope="session")
def loop() -> Iterator[Loop]:
    """The private event loop every async call of a benchmark runs on."""
    private = Loop()
    try:
        yield private
    finally:
        private.close()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisProcess]:
    """One throwaway redis-server (no persistence) for the session, stopped at the end."""
    with RedisProcess() as server:
        yield server


@dataclass(frozen=True)
class Signer:
    """A signing key, its verification half as taskgate loads it, and a token it signed."""

    alg: str
    key: SigningKey
    verification_key: VerificationKey
    token: str


@pytest.fixture(scope="session")
def signers() -> dict[str, Signer]:
    """One key per algorithm (RS256 is 2048-bit), with a typical token for each."""
    found = {}
    for alg in ALGS:
        key = SigningKey(alg, new_key(alg))
        issuer = Issuer(keys=[key])
        token = issuer.token(
            "acme", "alice", scopes=("tasks", "reports"), lifetime_s=TOKEN_LIFETIME_S
        )
        public = VerificationKey(key.kid, alg, key.private.public_key())
        found[alg] = Signer(alg, key, public, token)
    return found


@dataclass(frozen=True)
class ScaleResult:
    """One measurement of test_route_scale: a store of `routes` routes, the lookup's median."""

    store: str
    how: str  # "benchmark" (one case after another) or "interleaved" (sizes alternating)
    routes: int
    median_s: float


SCALE_RESULTS = pytest.StashKey[list[ScaleResult]]()


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """After the benchmark tables: the lookup median per store and size, and the ratio."""
    results = config.stash.get(SCALE_RESULTS, [])
    if not results:
        return
    terminalreporter.write_sep("-", "route lookup cost by recorded routes (resolve, cache off)")
    for store, how in dict.fromkeys((r.store, r.how) for r in results):
        mine = sorted((r for r in results if (r.store, r.how) == (store, how)), key=_routes)
        line = ", ".join(f"{r.routes:,}: {r.median_s * 1e6:.1f} us" for r in mine)
        if len(mine) > 1:
            line += f"; {mine[-1].routes:,}/{mine[0].routes:,} = "
            line += f"{mine[-1].median_s / mine[0].median_s:.2f}x"
        terminalreporter.write_line(f"{store:<7} {how:<12} median {line}")


def _routes(result: ScaleResult) -> int:
    return result.routes
