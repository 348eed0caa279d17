"""Sizing the Redis store: memory per task route, and the cost of a lookup from 1k to 1M routes.

    python -m bench.sizing [--routes 1000000] [--cluster | --url redis://127.0.0.1:6379/0]

Without --url it starts its own redis-server on loopback (no persistence), or with --cluster a
Redis Cluster of 3 masters (tests/support/redis_topologies.py), and stops it at the end; a
cluster's memory is the sum over its masters. Routes are recorded through the store itself
(gateway/store/redis_routes.py, the insert-only script), 64 at a time, with realistic fields: a UUID
task id, a replica URL, a tenant, a principal, a one-hour TTL. At each size (1k, 10k, 100k,
1M, up to --routes) it prints:

- `used_memory` growth per route since the empty database (INFO memory), and `MEMORY USAGE` of
  100 random route keys (the key, its hash and its expiry, as Redis accounts them);
- lookups through the store (`RedisRouteStore.lookup`, one HGETALL each), 16 at a time, for 2 s:
  lookups per second and p50/p99 latency as the store's caller sees it;
- how fast the routes were recorded.

Every figure is measured in the run that prints it; nothing is estimated.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from bench import procs
from gateway.store.base import TaskRoute, now_ms
from gateway.store.keys import route_key
from gateway.store.redis_routes import RedisRouteStore
from tests.support.redis_topologies import ClusterGroup

STEPS = (1_000, 10_000, 100_000, 1_000_000)
RECORD_CONCURRENCY = 64
LOOKUP_CONCURRENCY = 16
LOOKUP_SECONDS = 2.0
SAMPLE_KEYS = 100


def a_route(index: int) -> TaskRoute:
    created = now_ms()
    return TaskRoute(
        task_id=str(uuid.uuid4()),
        backend="reports",
        replica=f"http://10.0.{index % 4}.12:9101/mcp",
        tenant=f"tenant-{index % 50:02d}",
        principal=f"user-{index % 5000:04d}@example.com",
        created_at_ms=created,
        ttl_ms=3_600_000,
        expires_at_ms=created + 3_600_000 + 60_000,
    )


async def record_many(store: RedisRouteStore, routes: list[TaskRoute]) -> float:
    """Record `routes`, RECORD_CONCURRENCY at a time; routes per second."""
    queue = iter(routes)
    started = time.perf_counter()

    async def worker() -> None:
        for route in queue:
            await store.record(route)

    await asyncio.gather(*(worker() for _ in range(RECORD_CONCURRENCY)))
    return len(routes) / (time.perf_counter() - started)


async def lookups(store: RedisRouteStore, ids: list[str]) -> tuple[float, float, float]:
    """(lookups per second, p50 ms, p99 ms) over LOOKUP_SECONDS, LOOKUP_CONCURRENCY at a time."""
    latencies: list[float] = []
    deadline = time.perf_counter() + LOOKUP_SECONDS

    async def worker() -> None:
        while time.perf_counter() < deadline:
            task_id = random.choice(ids)
            started = time.perf_counter()
            found = await store.lookup(task_id)
            latencies.append(time.perf_counter() - started)
            assert found is not None, f"route {task_id} was recorded and must be found"

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(LOOKUP_CONCURRENCY)))
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return len(latencies) / elapsed, statistics.median(ordered) * 1000, p99 * 1000


class Server:
    """What sizing reads from Redis beside the store: keys, memory, one key's usage; for a
    cluster, summed over its masters (the seed URL as redis://)."""

    def __init__(self, url: str) -> None:
        self.cluster: RedisCluster | None = None
        self.single: aioredis.Redis | None = None
        if url.startswith("redis+cluster://"):
            seed = "redis://" + url.removeprefix("redis+cluster://").split(",")[0]
            self.cluster = RedisCluster.from_url(seed)
        else:
            self.single = aioredis.Redis.from_url(url)

    async def keys(self) -> int:
        if self.cluster is not None:
            return int(await self.cluster.dbsize())  # summed over the primaries by redis-py
        assert self.single is not None
        return int(await self.single.dbsize())

    async def used_memory(self) -> int:
        if self.cluster is not None:
            per_node = await self.cluster.info("memory", target_nodes=RedisCluster.PRIMARIES)
            return sum(int(info["used_memory"]) for info in per_node.values())
        assert self.single is not None
        return int((await self.single.info("memory"))["used_memory"])

    async def memory_usage(self, key: str, samples: int = 0) -> int | None:
        client: Any = self.cluster if self.cluster is not None else self.single
        usage = await client.memory_usage(key, samples=samples)
        return None if usage is None else int(usage)

    async def close(self) -> None:
        if self.cluster is not None:
            await self.cluster.aclose()
        if self.single is not None:
            await self.single.aclose()


async def measure(url: str, total: int) -> list[dict[str, Any]]:
    client = Server(url)
    store = RedisRouteStore(url, timeout_s=5)
    rows: list[dict[str, Any]] = []
    try:
        if await client.keys():
            raise SystemExit("the database is not empty: sizing needs an empty one")
        empty = await client.used_memory()
        ids: list[str] = []
        for size in [s for s in STEPS if s <= total] or [total]:
            routes = [a_route(i) for i in range(len(ids), size)]
            rate = await record_many(store, routes)
            ids += [route.task_id for route in routes]
            used = await client.used_memory()
            sample = random.sample(ids, min(SAMPLE_KEYS, len(ids)))
            usage = [await client.memory_usage(route_key(i), samples=0) for i in sample]
            per_key = statistics.mean(u for u in usage if u is not None)
            per_second, p50, p99 = await lookups(store, ids)
            rows.append(
                {
                    "routes": size,
                    "used_memory_per_route": (used - empty) / size,
                    "memory_usage_per_key": per_key,
                    "record_per_s": rate,
                    "lookup_per_s": per_second,
                    "lookup_p50_ms": p50,
                    "lookup_p99_ms": p99,
                }
            )
            print_row(rows[-1])
    finally:
        await store.close()
        await client.close()
    return rows


def print_row(row: dict[str, Any]) -> None:
    per_gb = 2**30 / row["used_memory_per_route"]
    print(
        f"{row['routes']:>9,} routes | {row['used_memory_per_route']:6.0f} B/route used_memory"
        f" ({per_gb / 1e6:5.2f} M routes/GiB) | MEMORY USAGE {row['memory_usage_per_key']:4.0f} B"
        f" | recorded {row['record_per_s']:7,.0f}/s | lookups {row['lookup_per_s']:7,.0f}/s"
        f" p50 {row['lookup_p50_ms']:.3f} ms p99 {row['lookup_p99_ms']:.3f} ms",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--routes", type=int, default=1_000_000, help="routes at the end")
    parser.add_argument("--url", help="an empty Redis database (default: start redis-server)")
    parser.add_argument("--cluster", action="store_true", help="start a 3-master cluster")
    args = parser.parse_args()
    if not 1_000 <= args.routes <= 10_000_000:
        parser.error("--routes must be 1,000..10,000,000 (the run is bounded)")
    print(f"bench.sizing: {args.routes:,} routes, {RECORD_CONCURRENCY} recording at a time")
    if args.url:
        asyncio.run(measure(args.url, args.routes))
        return
    if args.cluster:
        with ClusterGroup(masters=3) as cluster:
            print("a Redis Cluster of 3 masters on loopback, started and stopped by this run")
            asyncio.run(measure(cluster.url, args.routes))
        return
    with tempfile.TemporaryDirectory(prefix="taskgate-sizing-") as work:
        port = procs.free_port()
        with procs.redis(port, Path(work)):
            version = asyncio.run(_version(port))
            print(
                f"redis-server {version} on 127.0.0.1:{port}, no persistence, started and "
                "stopped by this run"
            )
            asyncio.run(measure(f"redis://127.0.0.1:{port}/0", args.routes))


async def _version(port: int) -> str:
    client: aioredis.Redis = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
    try:
        return str((await client.info("server"))["redis_version"])
    finally:
        await client.aclose()


if __name__ == "__main__":
    main()
