"""Chaos for the tasks taskgate runs itself: 300 creations through two gateways while a replica,
the gateway holding calls and Redis die.

Two `taskgate run` processes (A and B) share one Redis (AOF, fsync always) in front of two
replicas of a backend without tasks (backends/plain.py), whose `work` calls taskgate runs as
tasks of its own (a route's `task.mode: always`). While tasks are created through A and B
alternately, as two tenants, each call lasting up to two seconds, a replica is SIGKILLed and
restarted, A is SIGKILLed with calls it holds and started again, and Redis is SIGKILLed and
restarted from its AOF. Afterwards every task id a client received:

- is found through both gateways (0 lost), and ends: completed with its own call's result, or
  failed saying why (its holder stopped, its replica broke off); none stays `working` (0 stuck);
- was run at most once: the replica that never died counts at most one start per call;
- answers another tenant's and another principal's tasks/get, tasks/update and tasks/cancel
  with exactly the bytes a made-up id gets (0 cross-tenant).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from gateway.store.made import HOLDER_STOPPED
from tests.support.chaos import (
    UNIFORM_NOT_FOUND,
    Caller,
    Creation,
    TaskgateProcess,
    Weather,
    classify_create,
    free_ports,
    post_as,
)
from tests.support.issuer import jwt_auth, running_issuer
from tests.support.mcp import TERMINAL_STATUSES, build_request, poll_until, post_raw
from tests.support.procs import LOOPBACK, PlainBackendProcess, RedisProcess, stop_all

CREATIONS = 300
CONCURRENCY = 16
FAULTS = {"replica": 80, "gateway": 160, "redis": 240}  # creations done when each strikes
GATE_AFTER = 20  # creations from a fault's point on wait until it has struck
HELD_S = 20.0  # how long the calls around A's kill last
LEASE_S = 3
FOREIGN = 20
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=30)


def _config(path: Path, port: int, redis_url: str, replicas: list[str], auth: Any) -> Path:
    config = {
        "listen": {"host": LOOPBACK, "port": port},
        "store": {"url": redis_url, "timeout_s": 1},
        "tasks": {
            "record_timeout_s": 2,
            "made": {
                "lease_s": LEASE_S,
                "max_per_principal": 10_000,
                "max_running_per_principal": 256,
            },
        },
        "auth": auth,
        "backends": {"plain": {"replicas": replicas, "timeout_s": 15}},
        "routes": [
            {"tools": ["stats"], "backend": "plain"},
            {"tools": ["work"], "backend": "plain", "task": {"mode": "always", "ttl_s": 600}},
        ],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


async def test_no_task_taskgate_runs_is_lost_stuck_run_twice_or_seen_by_a_stranger(
    tmp_path: Path,
) -> None:
    redis_server = RedisProcess(aof=True)
    replicas = [PlainBackendProcess("m1"), PlainBackendProcess("m2")]
    gateways: list[TaskgateProcess] = []
    weather = Weather()
    ids = itertools.count(1)
    try:
        redis_server.start()
        for replica in replicas:
            replica.launch()
        for replica in replicas:
            replica.wait_ready(30.0)
        urls = [replica.url for replica in replicas]
        async with (
            running_issuer() as issuer,
            aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as http,
        ):
            for name, port in zip(("A", "B"), free_ports(2), strict=True):
                path = _config(tmp_path / f"{name}.yaml", port, redis_server.url, urls,
                               jwt_auth(issuer))  # fmt: skip
                gateways.append(TaskgateProcess(name, path, port))
            for gateway in gateways:
                await gateway.start()
            a, b = gateways

            def caller(tenant: str, subject: str) -> Caller:
                return Caller(tenant, subject, issuer.token(tenant, subject, lifetime_s=1800))

            alice, gina, mallory = (
                caller("acme", "alice"),
                caller("globex", "gina"),
                caller("acme", "mallory"),
            )
            ledger: list[Creation] = []
            done = asyncio.Event()
            marks = {fault: asyncio.Event() for fault in FAULTS}
            struck = {fault: asyncio.Event() for fault in FAULTS}
            # Resolved by the next task A hands out whose call lasts (A is killed holding it).
            armed: asyncio.Future[Creation] = asyncio.get_running_loop().create_future()

            async def create(n: int) -> None:
                for fault, at in FAULTS.items():
                    if n >= at + GATE_AFTER:  # a fast load cannot outrun a fault
                        async with asyncio.timeout(60):
                            await struck[fault].wait()
                gateway = gateways[n % 2]
                owner = (alice, gina)[(n // 2) % 2]
                request_id = next(ids)
                creation = Creation(n, owner, gateway.name, f"chaos-made-{n}", time.monotonic())
                wait_s = 0.1 * (n % 20)
                if FAULTS["gateway"] <= n < FAULTS["gateway"] + GATE_AFTER:
                    wait_s = HELD_S  # certainly still running when A is killed
                arguments = {"label": creation.size, "wait_s": wait_s}
                try:
                    answer = await post_as(http, gateway.url, owner, "tools/call",
                                           {"name": "work", "arguments": arguments},
                                           id=request_id)  # fmt: skip
                except (TimeoutError, aiohttp.ClientError) as exc:
                    creation.error = f"connection: {type(exc).__name__}"
                else:
                    classify_create(creation, answer, request_id)
                ledger.append(creation)
                due = wait_s == HELD_S and gateway is a
                if creation.task_id and due and not armed.done():
                    armed.set_result(creation)
                for fault, at in FAULTS.items():
                    if len(ledger) >= at:
                        marks[fault].set()
                if creation.error:
                    async with asyncio.timeout(60):
                        await weather.calm.wait()

            async def load() -> None:
                indices = iter(range(CREATIONS))

                async def worker() -> None:
                    for n in indices:
                        await create(n)

                async with asyncio.TaskGroup() as group:
                    for _ in range(CONCURRENCY):
                        group.create_task(worker())
                done.set()

            async def drive() -> None:
                await marks["replica"].wait()
                began = weather.begin()
                replicas[1].kill()
                struck["replica"].set()
                await weather.in_thread(replicas[1].restart)
                weather.end("replica", began)
                async with asyncio.timeout(60):
                    await armed
                began = weather.begin()
                a.kill()  # holding at least the call it just took
                struck["gateway"].set()
                await a.start()
                weather.end("gateway", began)
                await marks["redis"].wait()
                began = weather.begin()
                redis_server.kill()
                struck["redis"].set()
                await weather.in_thread(redis_server.restart)
                weather.end("redis", began)

            async with asyncio.timeout(180), asyncio.TaskGroup() as group:
                group.create_task(load())
                group.create_task(drive())

            unexpected = [c for c in ledger if c.unexpected]
            assert not unexpected, [(c.index, c.unexpected) for c in unexpected]
            received = [c for c in ledger if c.task_id is not None]
            assert len(received) > CREATIONS // 2

            async def ended(creation: Creation) -> dict[str, Any]:
                """The task's last state through B, and the same through A."""
                assert creation.task_id is not None
                get = {"taskId": creation.task_id}

                async def settled(url: str) -> dict[str, Any]:
                    async def probe() -> dict[str, Any]:
                        answer = await post_as(http, url, creation.caller, "tasks/get", get,
                                               id=next(ids))  # fmt: skip
                        found: dict[str, Any] = answer.message
                        return found

                    # Until it ends or is not found; the retryable error (Redis restarting, the
                    # store's backoff after it) is what a client retries.
                    return await poll_until(probe, _settled, within=LEASE_S + 30)

                final = await settled(b.url)
                through_a = await settled(a.url)
                assert through_a.get("result") == final.get("result"), creation.task_id
                return final

            limit = asyncio.Semaphore(16)

            async def bounded(creation: Creation) -> dict[str, Any]:
                async with limit:
                    return await ended(creation)

            finals = await asyncio.gather(*(bounded(c) for c in received))
            lost = [c.task_id for c, m in zip(received, finals, strict=True) if "error" in m]
            assert not lost, ([m["error"] for m in finals if "error" in m][:5], lost[:5])
            statuses: Counter[str] = Counter()
            reasons: Counter[str] = Counter()
            for creation, final in zip(received, finals, strict=True):
                task = final["result"]
                statuses[task["status"]] += 1
                if task["status"] == "completed":
                    assert task["result"]["structuredContent"]["label"] == creation.size
                elif task["status"] == "failed":
                    reasons[task["error"]["message"][:60]] += 1
            assert set(statuses) <= {"completed", "failed"}, statuses
            # The faults bit: A died holding calls, and those tasks said so.
            assert any(reason.startswith(HOLDER_STOPPED) for reason in reasons), reasons

            # Run at most once: the replica that never died started each call at most once.
            started: Counter[int] = Counter()
            for creation in received:
                answer = await post_as(http, replicas[0].url, alice, "tools/call",
                                       {"name": "stats", "arguments": {"label": creation.size}},
                                       id=next(ids))  # fmt: skip
                started[answer.message["result"]["structuredContent"]["started"]] += 1
            assert set(started) <= {0, 1}, started

            # Strangers get the bytes of a made-up id, for every task method.
            strangers = {"acme": [gina, mallory], "globex": [alice]}
            made_up = "taskgate.not-a-task-of-anyone-000000000000"
            for creation in received[:FOREIGN]:
                assert creation.task_id is not None
                for stranger in strangers[creation.caller.tenant]:
                    calls: tuple[tuple[str, dict[str, Any]], ...] = (
                        ("tasks/get", {}), ("tasks/cancel", {}),
                        ("tasks/update", {"inputResponses": {}}),
                    )  # fmt: skip
                    for method, extra in calls:
                        theirs = await _raw(http, b.url, stranger, method, creation.task_id, extra)
                        nobody = await _raw(http, b.url, stranger, method, made_up, extra)
                        assert theirs == nobody == UNIFORM_NOT_FOUND, (method, theirs)
            print(
                f"\nchaos (made tasks): {len(ledger)} creations, {len(received)} ids, errors "
                f"{Counter(c.error for c in ledger if c.error)}; ended {dict(statuses)}; "
                f"failed because {dict(reasons)}"
            )
    finally:
        await weather.settle()
        for gateway in gateways:
            gateway.stop()
        stop_all([*replicas, redis_server])


async def _raw(
    http: aiohttp.ClientSession,
    url: str,
    caller: Caller,
    method: str,
    task_id: str,
    extra: dict[str, Any],
) -> Any:
    body = build_request(method, {"taskId": task_id, **extra}, id=1)
    answer = await post_raw(http, url, body, headers=caller.auth)
    assert answer.status == 200, answer
    return answer.message["error"]


def _settled(message: dict[str, Any]) -> bool:
    """A task that ended, or an error that is not "retry"."""
    error = message.get("error")
    if error is not None:
        return not (isinstance(error.get("data"), dict) and error["data"].get("retryable"))
    return bool(message["result"]["status"] in TERMINAL_STATUSES)
