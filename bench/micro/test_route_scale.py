"""Route lookup cost against the number of recorded routes: 1,000 and 1,000,000.

What is measured is TaskRouter.resolve with the route cache off (cache_size=0): one store
lookup plus the owner check per call, of a random existing id each time (10,000 ids sampled
from the store, cycled), as their owner.

The stores are filled directly, fast, in the gateway's own layout:
- Redis: HSET + PEXPIREAT of each route, pipelined in batches of 10,000 routes, with
  gateway.store.keys.route_key and gateway.store.redis_routes's field list; one redis-server per
  size (no persistence), so that the two sizes can be measured side by side.
- SQLite: one transaction (executemany) into the table SQLiteRouteStore.open() created (WAL); the
  store then reads it through its own connection, as the gateway does.

Two measurements per store: the pytest-benchmark cases (one size after the other), and
test_lookup_interleaved, which alternates short blocks of lookups between the two sizes, so
that load from other processes on the machine falls on both alike; the summary at the end
prints both medians and the 1M/1k ratio. The 1M cases are marked `large`: -m "not large"
deselects them (and leaves 1k only).
"""

from __future__ import annotations

import itertools
import random
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.micro.conftest import SCALE_RESULTS, Loop, ScaleResult
from gateway.auth import Principal
from gateway.config import TasksConfig
from gateway.store.base import TaskRoute, TaskRouteStore, now_ms
from gateway.store.keys import route_key
from gateway.store.redis_routes import RedisRouteStore, _fields
from gateway.store.sqlite_routes import SQLiteRouteStore
from gateway.tasks.routes import TaskRouter
from gateway.upstream.pool import Pool
from tests.support.procs import RedisProcess

pytestmark = pytest.mark.timeout(600)

SIZES = {"1k": 1_000, "1M": 1_000_000}
BATCH = 10_000
SAMPLE = 10_000
SEED = 20260728
LIFETIME_MS = 4 * 3_600_000  # every route outlives the run
INTERLEAVED_ROUNDS = 40
INTERLEAVED_BLOCK = 250
SQLITE_INSERT = (
    "INSERT INTO task_routes (task_id, backend, replica, tenant, principal, created_at_ms, "
    "ttl_ms, expires_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def _task_ids(n: int, rng: random.Random) -> list[str]:
    """n distinct random UUIDv4-shaped ids, in random order."""
    ids: set[str] = set()
    while len(ids) < n:
        h = f"{rng.getrandbits(128):032x}"
        ids.add(f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}")
    return list(ids)


def _route(i: int, task_id: str, now: int) -> TaskRoute:
    """Route number i: 4 backends of 2 replicas, 100 tenants, 5,000 principals."""
    return TaskRoute(
        task_id=task_id,
        backend=f"backend-{i % 4}",
        replica=f"http://10.0.{i % 4}.{10 + i % 2}:8000/mcp",
        tenant=f"tenant-{i % 100}",
        principal=f"user-{i % 5000}",
        created_at_ms=now - i % 600_000,
        ttl_ms=3_600_000,
        expires_at_ms=now + LIFETIME_MS,
    )


def _owner(i: int) -> Principal:
    return Principal(tenant=f"tenant-{i % 100}", subject=f"user-{i % 5000}")


def _fill_redis(server: RedisProcess, ids: list[str], now: int) -> None:
    """Pipelined: each batch is sent whole, then its replies are read. redis-py's connection
    API directly (pack_commands, one send, read_response per reply): a third faster than its
    Pipeline object, which builds a response object per command."""
    with server.client() as client:
        conn = client.connection_pool.get_connection()
        try:
            for start in range(0, len(ids), BATCH):
                commands: list[tuple[Any, ...]] = []
                for i in range(start, min(start + BATCH, len(ids))):
                    route = _route(i, ids[i], now)
                    key = route_key(route.task_id)
                    commands.append(("HSET", key, *_fields(route)))
                    commands.append(("PEXPIREAT", key, route.expires_at_ms))
                conn.send_packed_command(conn.pack_commands(commands))
                for _ in commands:
                    conn.read_response()
        finally:
            client.connection_pool.release(conn)
        assert client.dbsize() == len(ids)


def _fill_sqlite(path: Path, ids: list[str], now: int) -> None:
    rows = (
        (r.task_id, r.backend, r.replica, r.tenant, r.principal, r.created_at_ms, r.ttl_ms,
         r.expires_at_ms)
        for r in (_route(i, task_id, now) for i, task_id in enumerate(ids))
    )  # fmt: skip
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        # A large page cache for this connection only: random-order inserts stay in memory.
        conn.execute("PRAGMA cache_size=-262144")
        conn.execute("BEGIN")
        conn.executemany(SQLITE_INSERT, rows)
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (count,) = conn.execute("SELECT count(*) FROM task_routes").fetchone()
        assert count == len(ids)
    finally:
        conn.close()


@dataclass
class Filled:
    store: TaskRouteStore
    routes: int
    fill_s: float
    sample: list[tuple[str, Principal]]  # (task id, its owner), in random order


class Stores:
    """Filled stores, made on first use and kept for the module, then closed and removed."""

    def __init__(self, loop: Loop) -> None:
        self._loop = loop
        self._dir = Path(tempfile.mkdtemp(prefix="taskgate-bench-scale-"))
        self._filled: dict[tuple[str, str], Filled] = {}
        self._servers: list[RedisProcess] = []

    def get(self, kind: str, size: str) -> Filled:
        if (kind, size) not in self._filled:
            self._filled[kind, size] = self._fill(kind, SIZES[size])
        return self._filled[kind, size]

    def _fill(self, kind: str, n: int) -> Filled:
        rng = random.Random(SEED)
        ids = _task_ids(n, rng)
        sample = [(ids[i], _owner(i)) for i in rng.sample(range(n), min(n, SAMPLE))]
        now = now_ms()
        store: TaskRouteStore
        if kind == "redis":
            server = RedisProcess()
            self._servers.append(server)
            server.start()
            started = time.perf_counter()
            _fill_redis(server, ids, now)
            fill_s = time.perf_counter() - started
            store = RedisRouteStore(server.url, timeout_s=2.0)
        else:
            path = self._dir / f"routes-{n}.db"
            sqlite_store = SQLiteRouteStore(path, timeout_s=2.0)
            store = sqlite_store
            self._loop.run(sqlite_store.open())  # the table, in WAL mode, as the gateway has it
            started = time.perf_counter()
            _fill_sqlite(path, ids, now)
            fill_s = time.perf_counter() - started
        return Filled(store, n, fill_s, sample)

    def close(self) -> None:
        try:
            for filled in self._filled.values():
                self._loop.run(filled.store.close())
        finally:
            for server in self._servers:
                server.cleanup()
            shutil.rmtree(self._dir, ignore_errors=True)


@pytest.fixture(scope="module")
def stores(loop: Loop) -> Iterator[Stores]:
    bank = Stores(loop)
    try:
        yield bank
    finally:
        bank.close()


def _router(filled: Filled) -> TaskRouter:
    # The pool is only used to cancel unrecorded tasks, which resolve never does (nothing
    # connects).
    return TaskRouter(filled.store, TasksConfig(), Pool(), cache_size=0)


def _check(loop: Loop, router: TaskRouter, filled: Filled) -> None:
    """The sampled ids resolve to their owners' routes (and the cache stays off)."""
    for task_id, owner in filled.sample[:100]:
        route = loop.run(router.resolve(task_id, owner, 1))
        assert (route.task_id, route.tenant, route.principal) == (
            task_id,
            owner.tenant,
            owner.subject,
        )
    assert len(router.cache) == 0


def _record(request: pytest.FixtureRequest, result: ScaleResult) -> None:
    request.config.stash.setdefault(SCALE_RESULTS, []).append(result)


@pytest.mark.parametrize(
    ("kind", "size"),
    [
        pytest.param("redis", "1k", id="redis-1k"),
        pytest.param("redis", "1M", id="redis-1M", marks=pytest.mark.large),
        pytest.param("sqlite", "1k", id="sqlite-1k"),
        pytest.param("sqlite", "1M", id="sqlite-1M", marks=pytest.mark.large),
    ],
)
def test_lookup_scale(
    benchmark: Any,
    request: pytest.FixtureRequest,
    loop: Loop,
    stores: Stores,
    kind: str,
    size: str,
) -> None:
    filled = stores.get(kind, size)
    benchmark.group = f"route-scale-{kind}"
    benchmark.extra_info["fill_s"] = round(filled.fill_s, 2)
    router = _router(filled)
    _check(loop, router, filled)
    ids = itertools.cycle(filled.sample)

    def lookup() -> TaskRoute:
        task_id, owner = next(ids)
        return loop.run(router.resolve(task_id, owner, 1))

    benchmark(lookup)
    assert len(router.cache) == 0
    if benchmark.stats is not None:  # None under --benchmark-disable
        _record(
            request, ScaleResult(kind, "benchmark", filled.routes, benchmark.stats.stats.median)
        )


@pytest.mark.large
@pytest.mark.parametrize("kind", ["redis", "sqlite"])
def test_lookup_interleaved(
    request: pytest.FixtureRequest, loop: Loop, stores: Stores, kind: str
) -> None:
    """1k and 1M side by side: blocks of lookups alternate between the two stores (which
    goes first alternates too), each lookup timed on its own; medians over all blocks."""
    cases = {size: stores.get(kind, size) for size in SIZES}
    routers = {size: _router(filled) for size, filled in cases.items()}
    cycles = {size: itertools.cycle(filled.sample) for size, filled in cases.items()}
    samples: dict[str, list[int]] = {size: [] for size in SIZES}
    for size, router in routers.items():
        _check(loop, router, cases[size])
    order = list(SIZES)
    for _ in range(INTERLEAVED_ROUNDS):
        for size in order:
            router, ids, times = routers[size], cycles[size], samples[size]
            for _ in range(INTERLEAVED_BLOCK):
                task_id, owner = next(ids)
                started = time.perf_counter_ns()
                loop.run(router.resolve(task_id, owner, 1))
                times.append(time.perf_counter_ns() - started)
        order.reverse()
    for size, times in samples.items():
        median_s = statistics.median(times) / 1e9
        _record(request, ScaleResult(kind, "interleaved", SIZES[size], median_s))
