"""The scale run: 3 taskgate instances, 4 replicas, a Redis Cluster, 10,000 task creations,
while one instance is killed and one Redis master fails over; once per durability policy.

    python -m bench.scale [--tasks 10000] [--policies none,wait_replicas,wait_aof]

For each policy, all on loopback and all stopped by pid at the end: a cluster of 3 masters
with one replica each (tests/support/redis_topologies.py; cluster-node-timeout 1 s), 4 instant
replicas (bench/instant_backend.py, which create a task on `make_task`), and 3 `taskgate run`
processes sharing the cluster with `store.durability` set to the policy. Clients create tasks
round-robin over the instances, CONCURRENCY at a time. At a third of the creations instance
B is SIGKILLed (its clients move to the others); at two thirds the master holding the most
routes is SIGKILLed and the cluster promotes its replica. Afterwards:

- lost: ids a client received whose route is not in the cluster (HGETALL of its key): an id
  taskgate relayed that no instance can route any more. `wait_replicas` must lose none;
- unresolved: received ids that `tasks/get` through each surviving instance does not answer
  with the task (a lost route, or a misroute);
- creation throughput per instance and in total (ids received per second of the load phase),
  and the creations refused meanwhile (503 while the store fails over, connections to the
  killed instance); of those 503s, how many came while a node of the cluster said
  cluster_state:fail (polled every STATE_POLL_S): the cluster's own refusal of every slot,
  from the master's failure being agreed until its replica took over (with
  cluster-require-full-coverage yes, the default), which no client can avoid.

`wait_aof` needs WAITAOF (Redis >= 7.2): on an older redis-server taskgate refuses to start
and the run says so instead of measuring it. The server is the first `redis-server` (and
`redis-cli`) on PATH; Debian 12's is 7.0. Every node runs with AOF (appendfsync always).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import redis
import yaml
from redis.cluster import ClusterNode

from bench import procs
from gateway.store.keys import route_key
from tests.support.chaos import TaskgateProcess
from tests.support.mcp import build_request
from tests.support.procs import REDIS_SERVER, ProcessStartError
from tests.support.redis_topologies import PASSWORD, ClusterGroup, ClusterNodeProcess, running

INSTANCES = ("A", "B", "C")
REPLICAS = 4
CONCURRENCY = 48
CHECK_CONCURRENCY = 32
KILL_INSTANCE_AT = 1 / 3
FAIL_MASTER_AT = 2 / 3
CALM_TIMEOUT_S = 30.0
STATE_POLL_S = 0.05
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=20)


@dataclass
class Outcome:
    policy: str
    received: dict[str, str] = field(default_factory=dict)  # task id -> instance
    refused: Counter[str] = field(default_factory=Counter)  # why a creation got no id
    refused_down: int = 0  # of the 503s, those answered while the cluster said it was down
    load_s: float = 0.0
    lost: list[str] = field(default_factory=list)
    unresolved: Counter[str] = field(default_factory=Counter)
    not_run: str = ""


def taskgate_yaml(port: int, store_url: str, replicas: list[str], policy: str) -> dict[str, Any]:
    store: dict[str, Any] = {"url": store_url, "timeout_s": 2, "durability": policy}
    if policy == "wait_replicas":
        store["wait_replicas"] = 1
    return {
        "listen": {"host": "127.0.0.1", "port": port, "max_in_flight": 4000},
        "store": store,
        "tasks": {"record_timeout_s": 3},
        "logging": {"access": False},
        "backends": {"instant": {"replicas": replicas, "timeout_s": 10, "task_timeout_s": 5}},
        "routes": [{"tools": ["*"], "backend": "instant"}],
    }


async def create(http: aiohttp.ClientSession, url: str, n: int) -> tuple[str | None, str]:
    """One make_task; (task id, "") or (None, why it got none)."""
    body = build_request("tools/call", {"name": "make_task", "arguments": {}}, id=n)
    headers = {"Mcp-Method": "tools/call", "Mcp-Name": "make_task"}
    try:
        async with http.post(url, data=orjson.dumps(body), headers=_headers(headers)) as response:
            raw = await response.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return None, type(exc).__name__
    try:
        result = orjson.loads(raw).get("result") or {}
    except orjson.JSONDecodeError:
        return None, f"HTTP {response.status}, not JSON"
    task_id = result.get("taskId")
    return (task_id, "") if isinstance(task_id, str) else (None, f"HTTP {response.status}")


def _headers(extra: dict[str, str]) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        **extra,
    }


async def run_policy(policy: str, tasks: int, work: Path) -> Outcome:
    outcome = Outcome(policy)
    cluster = ClusterGroup(masters=3, replicas=1)
    for node in cluster.nodes:
        node.aof = True  # appendonly yes, appendfsync always: what wait_aof needs, as in production
    gateways: list[TaskgateProcess] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(cluster)  # started on entering, every node stopped on leaving
        ports = procs.free_ports(REPLICAS + len(INSTANCES))
        replicas = []
        for port in ports[:REPLICAS]:
            stack.enter_context(procs.instant_backend(port))
            replicas.append(f"http://127.0.0.1:{port}/mcp")
        for name, port in zip(INSTANCES, ports[REPLICAS:], strict=True):
            path = work / f"{policy}-{name}.yaml"
            path.write_text(yaml.safe_dump(taskgate_yaml(port, cluster.url, replicas, policy)))
            gateways.append(TaskgateProcess(f"{policy}-{name}", path, port))
        try:
            for gateway in gateways:
                stack.callback(gateway.stop)
                await gateway.start()
        except ProcessStartError as exc:
            outcome.not_run = str(exc).splitlines()[-1][:300]
            return outcome
        await load(outcome, gateways, cluster, tasks)
        await calm(cluster)
        await check(outcome, gateways, cluster)
    return outcome


async def load(
    outcome: Outcome, gateways: list[TaskgateProcess], cluster: ClusterGroup, tasks: int
) -> None:
    numbers = iter(range(tasks))
    done = 0
    killed_instance = failed_master = False
    alive = list(gateways)
    down = asyncio.Event()  # set while a running node says cluster_state:fail
    loaded = asyncio.Event()

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal done, killed_instance, failed_master
        for n in numbers:
            gateway = alive[n % len(alive)]
            was_down = down.is_set()
            task_id, why = await create(http, gateway.url, n)
            if task_id is None:
                outcome.refused[f"{gateway.name}: {why}"] += 1
                if why == "HTTP 503" and (was_down or down.is_set()):
                    outcome.refused_down += 1
            else:
                outcome.received[task_id] = gateway.name
            done += 1
            if not killed_instance and done >= tasks * KILL_INSTANCE_AT:
                killed_instance = True
                gateways[1].kill()  # instance B, SIGKILL, with requests in flight
                alive.remove(gateways[1])
            if not failed_master and done >= tasks * FAIL_MASTER_AT:
                failed_master = True
                busiest(cluster).kill()  # its replica is promoted after ~1 s

    started = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    watcher = asyncio.create_task(watch_state(cluster, down, loaded))
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=CLIENT_TIMEOUT) as http:
            await asyncio.gather(*(client(http) for _ in range(CONCURRENCY)))
    finally:
        loaded.set()
        await watcher
    outcome.load_s = time.perf_counter() - started


async def watch_state(cluster: ClusterGroup, down: asyncio.Event, loaded: asyncio.Event) -> None:
    """Until `loaded`: `down` set while any running node says its cluster_state is not ok."""
    while not loaded.is_set():
        states = await asyncio.to_thread(_cluster_states, cluster)
        if any(state != "ok" for state in states):
            down.set()
        else:
            down.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(loaded.wait(), STATE_POLL_S)


def _cluster_states(cluster: ClusterGroup) -> list[str]:
    states = []
    for node in cluster.nodes:
        if running(node):
            with contextlib.suppress(redis.RedisError):
                states.append(node.cluster_info().get("cluster_state", "unknown"))
    return states


def busiest(cluster: ClusterGroup) -> ClusterNodeProcess:
    """The master holding the most keys: the failover hits as many routes as it can."""
    masters = cluster.primaries()
    sizes = {}
    for node in masters:
        with node.client() as client:
            sizes[node.port] = int(client.dbsize())
    return max(masters, key=lambda node: sizes[node.port])


async def calm(cluster: ClusterGroup) -> None:
    """Until every running node says cluster_state:ok (the replica took over)."""
    deadline = time.monotonic() + CALM_TIMEOUT_S
    while time.monotonic() < deadline:
        states = []
        for node in cluster.nodes:
            if running(node):
                with contextlib.suppress(redis.RedisError):
                    states.append(node.cluster_info().get("cluster_state"))
        if states and all(state == "ok" for state in states):
            return
        await asyncio.sleep(0.1)
    raise SystemExit(f"the cluster did not settle within {CALM_TIMEOUT_S:g} s")


def missing_routes(cluster: ClusterGroup, ids: list[str]) -> list[str]:
    """The ids whose route key is not in the cluster, read with redis-py's cluster client in
    pipelines (grouped per node by the client)."""
    nodes = [
        ClusterNode("127.0.0.1", node.port)  # type: ignore[no-untyped-call]
        for node in cluster.nodes
        if running(node)
    ]
    missing: list[str] = []
    with redis.RedisCluster(startup_nodes=nodes, password=PASSWORD) as client:
        for start in range(0, len(ids), 1000):
            chunk = ids[start : start + 1000]
            pipe = client.pipeline()
            for task_id in chunk:
                pipe.exists(route_key(task_id))
            found = pipe.execute()
            missing += [i for i, there in zip(chunk, found, strict=True) if not there]
    return missing


async def check(outcome: Outcome, gateways: list[TaskgateProcess], cluster: ClusterGroup) -> None:
    ids = list(outcome.received)
    outcome.lost = await asyncio.to_thread(missing_routes, cluster, ids)
    survivors = [g for g in gateways if g.name != gateways[1].name]
    limit = asyncio.Semaphore(CHECK_CONCURRENCY)
    counter = itertools.count(1_000_000)

    async def resolve(http: aiohttp.ClientSession, gateway: TaskgateProcess, task_id: str) -> None:
        body = build_request("tasks/get", {"taskId": task_id}, id=next(counter))
        headers = _headers({"Mcp-Method": "tasks/get", "Mcp-Name": task_id})
        async with limit:
            try:
                async with http.post(
                    gateway.url, data=orjson.dumps(body), headers=headers
                ) as response:
                    answer = orjson.loads(await response.read())
            except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
                outcome.unresolved[f"{gateway.name}: {type(exc).__name__}"] += 1
                return
        result = answer.get("result") if isinstance(answer, dict) else None
        if not (isinstance(result, dict) and result.get("taskId") == task_id):
            error = answer.get("error", {}) if isinstance(answer, dict) else {}
            outcome.unresolved[f"{gateway.name}: {error.get('message', answer)}"] += 1

    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as http:
        await asyncio.gather(*(resolve(http, g, i) for g in survivors for i in ids))


def report(outcome: Outcome, tasks: int) -> None:
    if outcome.not_run:
        print(f"{outcome.policy:>13} | not run: {outcome.not_run}")
        return
    per_instance = Counter(outcome.received.values())
    total_rate = len(outcome.received) / outcome.load_s
    rates = ", ".join(
        f"{name} {per_instance[name] / outcome.load_s:,.0f}/s" for name in sorted(per_instance)
    )
    refused = sum(outcome.refused.values())
    print(
        f"{outcome.policy:>13} | {tasks:,} creations: {len(outcome.received):,} ids received, "
        f"{refused:,} refused | lost {len(outcome.lost)} | unresolved "
        f"{sum(outcome.unresolved.values())} | {total_rate:,.0f} creations/s in total ({rates})"
    )
    for why, count in outcome.refused.most_common(4):
        print(f"{'':>13} |   refused: {count:,} x {why}")
    print(
        f"{'':>13} |   of the 503s, {outcome.refused_down:,} while the cluster said "
        "cluster_state:fail"
    )
    for why, count in outcome.unresolved.most_common(4):
        print(f"{'':>13} |   unresolved: {count:,} x {why}")


def server_version() -> str:
    """The redis-server this run starts (the first on PATH), in its own words."""
    done = subprocess.run(
        [REDIS_SERVER, "--version"], capture_output=True, text=True, check=True, timeout=30
    )
    return done.stdout.strip()


async def main(tasks: int, policies: list[str], keep: str | None) -> None:
    print(f"{server_version()}; every node with appendonly yes, appendfsync always")
    print(
        f"bench.scale: {tasks:,} creations through {len(INSTANCES)} taskgate instances, "
        f"{REPLICAS} replicas, a Redis Cluster of 3 masters + 3 replicas; instance B SIGKILLed "
        f"at {KILL_INSTANCE_AT:.0%}, the busiest master SIGKILLed at {FAIL_MASTER_AT:.0%}"
    )
    with tempfile.TemporaryDirectory(prefix="taskgate-scale-") as temporary:
        work = Path(keep) if keep is not None else Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        for policy in policies:
            outcome = await run_policy(policy, tasks, work)
            report(outcome, tasks)
        if keep is not None:
            print(f"the instances' configurations and logs are in {work}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--policies", default="none,wait_replicas,wait_aof")
    parser.add_argument("--keep", help="a folder for the instances' configurations and logs")
    args = parser.parse_args()
    if not 100 <= args.tasks <= 100_000:
        parser.error("--tasks must be 100..100,000 (the run is bounded)")
    asyncio.run(main(args.tasks, args.policies.split(","), args.keep))
