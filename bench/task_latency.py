"""tasks/get through taskgate against the same call direct, and the cost of recording a route.

    python -m bench.task_latency [--requests 2000] [--json out.json]

Starts on loopback: a backend that answers at once (bench/instant_backend.py, so that what is
measured is taskgate's own cost), a redis-server, and taskgate four times: SQLite and Redis
stores, each with the route cache on and off (off: every tasks/get reads the store). One client
connection sends tasks/get for one task sequentially, alternating direct and through taskgate
in blocks so that drift on a shared machine hits both sides alike. Prints p50/p99 of each and
the difference; then times
TaskRouteStore.record() for each store, in process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench import procs
from gateway.store.base import TaskRoute, TaskRouteStore, now_ms
from gateway.store.redis_routes import RedisRouteStore
from gateway.store.sqlite_routes import SQLiteRouteStore

META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {
        "extensions": {"io.modelcontextprotocol/tasks": {}}
    },
}
BLOCK = 100


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def rpc(
    http: aiohttp.ClientSession, url: str, method: str, params: dict[str, Any], name: str | None
) -> Any:
    body = orjson.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": META}}
    )
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": method,
    }
    if name is not None:
        headers["Mcp-Name"] = name
    async with http.post(url, data=body, headers=headers) as response:
        return orjson.loads(await response.read())


async def get_latencies(direct: str, gateway: str, requests: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"direct": [], "taskgate": []}
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as http:
        created = await rpc(
            http,
            gateway,
            "tools/call",
            {"name": "make_task", "arguments": {}},
            "make_task",
        )
        assert "result" in created, created
        task_id = created["result"]["taskId"]
        params = {"taskId": task_id}
        for url in (direct, gateway):  # warm both paths (pools, caches) before timing
            for _ in range(50):
                await rpc(http, url, "tasks/get", params, task_id)
        for block in range(requests // BLOCK):
            order = ("direct", "taskgate") if block % 2 == 0 else ("taskgate", "direct")
            for side in order:
                url = direct if side == "direct" else gateway
                for _ in range(BLOCK):
                    start = time.perf_counter()
                    answer = await rpc(http, url, "tasks/get", params, task_id)
                    samples[side].append((time.perf_counter() - start) * 1000)
                    assert answer["result"]["taskId"] == task_id, answer
    return samples


async def record_costs(store: TaskRouteStore, count: int) -> list[float]:
    samples = []
    for i in range(count):
        created = now_ms()
        route = TaskRoute(
            task_id=f"bench-{created}-{i}",
            backend="reports",
            replica="http://127.0.0.1:9101/mcp",
            tenant="acme",
            principal="alice",
            created_at_ms=created,
            ttl_ms=60_000,
            expires_at_ms=created + 60_000,
        )
        start = time.perf_counter()
        await store.record(route)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def write_config(path: Path, port: int, backend_url: str, store: str, cache: int) -> None:
    path.write_text(
        f"listen: {{host: 127.0.0.1, port: {port}}}\n"
        f"store: {{url: '{store}', cache_size: {cache}}}\n"
        f"backends:\n  reports: {{replicas: ['{backend_url}']}}\n"
        "routes:\n  - {tools: ['*'], backend: reports}\n"
    )


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(samples, 0.50), 3),
        "p99_ms": round(percentile(samples, 0.99), 3),
        "mean_ms": round(statistics.fmean(samples), 3),
        "n": len(samples),
    }


async def main(requests: int, out: Path | None) -> None:
    results: dict[str, Any] = {"method": __doc__.strip().splitlines()[0], "requests": requests}
    with tempfile.TemporaryDirectory(prefix="taskgate-bench-") as tmp:
        work = Path(tmp)
        backend_port, redis_port = procs.free_ports(2)
        direct = f"http://127.0.0.1:{backend_port}/mcp"
        with procs.instant_backend(backend_port), procs.redis(redis_port, work):
            redis_url = f"redis://127.0.0.1:{redis_port}/0"
            for store_name, store_url, cache in (
                ("sqlite", f"sqlite:///{work}/routes.db", 10_000),
                ("sqlite_nocache", f"sqlite:///{work}/routes.db", 0),
                ("redis", redis_url, 10_000),
                ("redis_nocache", redis_url, 0),
            ):
                gateway_port = procs.free_port()
                config = work / f"{store_name}.yaml"
                write_config(config, gateway_port, direct, store_url, cache)
                with procs.taskgate(config, gateway_port):
                    gateway = f"http://127.0.0.1:{gateway_port}/mcp"
                    samples = await get_latencies(direct, gateway, requests)
                d, g = summary(samples["direct"]), summary(samples["taskgate"])
                results[f"tasks_get_{store_name}"] = {
                    "direct": d,
                    "taskgate": g,
                    "added_p50_ms": round(g["p50_ms"] - d["p50_ms"], 3),
                    "added_p99_ms": round(g["p99_ms"] - d["p99_ms"], 3),
                }
            for store_name in ("sqlite", "redis"):
                store: TaskRouteStore
                if store_name == "sqlite":
                    sqlite = SQLiteRouteStore(work / "record.db", timeout_s=5)
                    await sqlite.open()
                    store = sqlite
                else:
                    store = RedisRouteStore(redis_url, timeout_s=5)
                try:
                    await record_costs(store, 50)
                    results[f"record_{store_name}"] = summary(await record_costs(store, requests))
                finally:
                    await store.close()
    print(json.dumps(results, indent=2))
    if out is not None:
        await asyncio.to_thread(out.write_text, json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.json))
