"""Chaos: 1,000 task creations through two gateways while a replica, a gateway and Redis die.

Two `taskgate run` processes (A and B) share one Redis (AOF, fsync always) in front of three
report replicas that keep their tasks in memory. While tasks are created through A and B
alternately, as two tenants, a replica is SIGKILLed mid-run and restarted empty, A is
SIGKILLed right after it handed out a task id (before anyone polled it) and started again on
the same port, and Redis is SIGKILLed and restarted from its AOF. Afterwards:

- every task id a client received has its route in Redis and resolves through both gateways,
  except the tasks of the SIGKILLed replica, whose memory died with it: for those the gateway
  still goes to the owner (its request log names that replica for the task's hash) and, as the
  owner now says "Task <id> not found", answers docs/tasks.md's one "Task not found";
- no call reached the wrong replica: a finished task names the replica its route records,
  and with that replica down its tasks get the retryable error, not another replica's answer;
- no cross-tenant read: another tenant's (or another principal's) tasks/get, tasks/update and
  tasks/cancel get exactly the bytes a made-up task id gets.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from gateway.observe.access import task_hash
from tests.support.chaos import (
    UNIFORM_NOT_FOUND,
    Caller,
    Creation,
    Progress,
    TaskgateProcess,
    Weather,
    classify_create,
    free_ports,
    post_as,
    write_gateway_config,
)
from tests.support.issuer import jwt_auth, running_issuer
from tests.support.mcp import (
    TERMINAL_STATUSES,
    Answer,
    JsonObject,
    build_request,
    poll_until,
    post_raw,
)
from tests.support.procs import BackendProcess, RedisProcess, start_backends, stop_all
from tests.support.tasks import APPROVE, UNFINISHED, assert_retryable

CREATIONS = 1_000
CONCURRENCY = 16
# Faults strike when this many creations have an outcome, one after the other. Creations
# from the fault's gate on wait until it has struck, so a fast load cannot outrun a fault.
REPLICA_KILL_AT = 150
GATEWAY_KILL_AT = 400
REDIS_KILL_AT = 650
GATE_AFTER = 100
FINISH_PER_TENANT = 20
FOREIGN_PER_TENANT = 25
OWNER_DOWN_SAMPLE = 6
CHECK_CONCURRENCY = 16
CALM_WITHIN = 60.0
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=30)
REPLICAS = ("r1", "r2", "r3")
DOOMED = "r2"

FAULTS = {"replica": REPLICA_KILL_AT, "gateway": GATEWAY_KILL_AT, "redis": REDIS_KILL_AT}
RESOLVED = "resolved"
OWNER_NOT_FOUND = "owner-not-found"


@dataclass
class Chaos:
    """One run: the processes, the callers, and the ledger of every creation's outcome."""

    http: aiohttp.ClientSession
    a: TaskgateProcess
    b: TaskgateProcess
    replicas: dict[str, BackendProcess]
    redis: RedisProcess
    owners: tuple[Caller, Caller]
    weather: Weather = field(default_factory=Weather)
    progress: Progress = field(default_factory=Progress)
    ledger: list[Creation] = field(default_factory=list)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    # Resolved with the next creation A answers with a task id, once the driver arms it.
    armed: asyncio.Future[Creation] | None = None
    struck: dict[str, asyncio.Event] = field(
        default_factory=lambda: {fault: asyncio.Event() for fault in FAULTS}
    )
    gateway_victim: Creation | None = None
    struck_at: dict[str, int] = field(default_factory=dict)

    @property
    def gateways(self) -> tuple[TaskgateProcess, TaskgateProcess]:
        return (self.a, self.b)

    def next_id(self) -> int:
        return next(self.ids)

    async def create(self, n: int) -> None:
        """Creation n: through A or B alternately, as each tenant through each gateway."""
        for fault, at in FAULTS.items():
            if n >= at + GATE_AFTER:
                async with asyncio.timeout(CALM_WITHIN):
                    await self.struck[fault].wait()
        gateway = self.gateways[n % 2]
        caller = self.owners[(n // 2) % 2]
        request_id = self.next_id()
        creation = Creation(n, caller, gateway.name, f"chaos-{n}", time.monotonic())
        params = {"name": "generate_report", "arguments": {"size": creation.size}}
        try:
            answer = await post_as(
                self.http, gateway.url, caller, "tools/call", params, id=request_id
            )
        except TimeoutError:
            creation.unexpected = "no answer within the client's timeout"
        except aiohttp.ClientError as exc:
            creation.error = f"connection: {type(exc).__name__}"
        else:
            classify_create(creation, answer, request_id)
        creation.received_at = time.monotonic()
        self.ledger.append(creation)
        self.progress.tick()
        if creation.task_id and gateway is self.a and self.armed and not self.armed.done():
            self.armed.set_result(creation)
        if creation.error:
            # A client that got an error waits for the fault to pass before creating again.
            async with asyncio.timeout(CALM_WITHIN):
                await self.weather.calm.wait()

    async def load(self) -> None:
        indices = iter(range(CREATIONS))

        async def worker() -> None:
            for n in indices:
                await self.create(n)

        async with asyncio.TaskGroup() as group:
            for _ in range(CONCURRENCY):
                group.create_task(worker())

    async def reached(self, count: int) -> None:
        async with asyncio.timeout(120):
            await self.progress.mark(count).wait()

    async def drive(self) -> None:
        """The faults, one after the other, each at its point of the run."""
        # 1 a replica is SIGKILLed with creations in flight and comes back on its port, empty
        await self.reached(FAULTS["replica"])
        doomed = self.replicas[DOOMED]
        began = self.weather.begin()
        doomed.kill()
        self.strike("replica")
        await self.weather.in_thread(doomed.restart)
        self.weather.end("replica", began)

        # 2 A is SIGKILLed right after it handed out a task id, before anyone polled the task
        await self.reached(FAULTS["gateway"])
        self.armed = asyncio.get_running_loop().create_future()
        self.strike("gateway")  # armed: the next id A hands out is the victim
        async with asyncio.timeout(60):
            victim = await self.armed
        began = self.weather.begin()
        self.a.kill()
        self.gateway_victim = victim
        await self.a.start()
        self.weather.end("gateway", began)
        assert victim.task_id is not None
        # The task's first poll, through the new A and through B: both find it.
        for gateway in self.gateways:
            answer = await self.tasks_get(gateway, victim.caller, victim.task_id)
            assert outcome(answer, victim.task_id) == RESOLVED, answer

        # 3 Redis is SIGKILLed and restarted from its AOF (fsync always: nothing acked is lost)
        await self.reached(FAULTS["redis"])
        began = self.weather.begin()
        self.redis.kill()
        self.strike("redis")
        await self.weather.in_thread(self.redis.restart)
        self.weather.end("redis", began)

    def strike(self, fault: str) -> None:
        self.struck_at[fault] = self.progress.finished
        self.struck[fault].set()

    async def tasks_get(self, gateway: TaskgateProcess, caller: Caller, task_id: str) -> Answer:
        return await post_as(
            self.http, gateway.url, caller, "tasks/get", {"taskId": task_id}, id=self.next_id()
        )


def outcome(answer: Answer, task_id: str, direct: Answer | None = None) -> str:
    """RESOLVED, OWNER_NOT_FOUND (taskgate's uniform not-found while the owner itself, asked
    `direct`, says it lost the task), or what it was instead. That taskgate asked the owner and
    not some other replica is checked apart, in its request log (owner_witnessed)."""
    try:
        message = answer.message
    except ValueError:
        return f"HTTP {answer.status}, not JSON: {answer.raw[:200]!r}"
    result = message.get("result")
    if answer.status == 200 and isinstance(result, dict):
        if result.get("taskId") == task_id and result.get("status") in UNFINISHED:
            return RESOLVED
        return f"an inconsistent task: {result!r}"
    # The backend's not-found names the id; taskgate answers its own (UNIFORM_NOT_FOUND) for it.
    owners_own = {"code": -32602, "message": f"Task {task_id} not found"}
    owner_lost = direct is not None and _error_of(direct) == owners_own
    if answer.status == 200 and message.get("error") == UNIFORM_NOT_FOUND and owner_lost:
        return OWNER_NOT_FOUND
    return f"HTTP {answer.status}: {answer.raw[:200]!r}"


def _error_of(answer: Answer) -> Any:
    try:
        return answer.message.get("error")
    except ValueError:
        return None


async def owner_witnessed(run: Chaos, lost: list[Creation]) -> list[str]:
    """Each gateway's request log has, for every lost task, a tasks/get line with the task's
    hash answered -32602 by the doomed replica itself: a route taskgate lost (or a call sent to
    another replica) would show no replica, or another one. Problems, or []."""
    replica = run.replicas[DOOMED].url.split("/")[2]
    wanted = {
        gateway.name: {
            task_hash(str(c.task_id)): f"rpc_code=-32602 backend=reports replica={replica} "
            for c in lost
        }
        for gateway in run.gateways
    }

    def missing() -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for gateway in run.gateways:
            lines = [
                line
                for line in gateway.log_text().splitlines()
                if " taskgate.access " in line and " method=tasks/get " in line
            ]
            by_task: dict[str, list[str]] = defaultdict(list)
            for line in lines:
                by_task[line.rsplit(" task=", 1)[-1].split(" ", 1)[0]].append(line)
            found[gateway.name] = [
                digest
                for digest, words in wanted[gateway.name].items()
                if not any(words in line for line in by_task.get(digest, []))
            ]
        return found

    # The logs are written in batches (gateway/observe/access.py, FLUSH_S): a little patience.
    left = missing()
    for _ in range(50):
        if not any(left.values()):
            break
        await asyncio.sleep(0.1)
        left = missing()
    return [
        f"{name}'s request log does not show replica {replica} answering task {digest}"
        for name, digests in left.items()
        for digest in digests
    ]


@dataclass
class Check:
    """What the checks after the run found: outcomes by kind, and every broken invariant."""

    outcomes: Counter[str] = field(default_factory=Counter)
    seen: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def expect(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)


async def bounded(items: Iterable[Any], check: Callable[[Any], Awaitable[None]]) -> None:
    """Run `check` on every item, CHECK_CONCURRENCY at a time."""
    limit = asyncio.Semaphore(CHECK_CONCURRENCY)

    async def one(item: Any) -> None:
        async with limit:
            await check(item)

    async with asyncio.timeout(120), asyncio.TaskGroup() as group:
        for item in items:
            group.create_task(one(item))


async def read_routes(redis_url: str, task_ids: list[str]) -> dict[str, dict[str, str]]:
    """Every route as Redis holds it: `HGETALL taskgate:route:{<taskId>}` (docs/stores.md)."""
    async with aioredis.Redis.from_url(redis_url, decode_responses=True) as client:
        pipe = client.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hgetall(f"taskgate:route:{{{task_id}}}")
        found = await pipe.execute()
    return dict(zip(task_ids, found, strict=True))


def spread(creations: list[Creation], routes: dict[str, dict[str, str]]) -> list[Creation]:
    """The creations interleaved by owning replica, so a prefix samples every replica."""
    by_owner: dict[str, list[Creation]] = defaultdict(list)
    for creation in creations:
        assert creation.task_id is not None
        by_owner[routes[creation.task_id]["replica"]].append(creation)
    rounds = itertools.zip_longest(*by_owner.values())
    return [creation for row in rounds for creation in row if creation is not None]


def allowed_outcomes(run: Chaos, creation: Creation, route: dict[str, str]) -> set[str]:
    """What tasks/get may answer for this task, given which replica died when."""
    doomed = run.replicas[DOOMED]
    killed, restarted = run.weather.faults["replica"]
    if route["replica"] != doomed.url or creation.sent_at >= restarted:
        return {RESOLVED}
    if creation.received_at <= killed:
        return {OWNER_NOT_FOUND}  # created by the process that was SIGKILLed
    # In flight across the kill: created by the old process, or failed over to the new one.
    return {RESOLVED, OWNER_NOT_FOUND}


async def check_resolution(run: Chaos, received: list[Creation], routes: Any, found: Check) -> None:
    """tasks/get through A and through B, as the task's owner, for every id handed out."""
    doomed = run.replicas[DOOMED]

    async def check(creation: Creation) -> None:
        task_id = creation.task_id
        assert task_id is not None
        route = routes[task_id]
        seen = []
        for gateway in run.gateways:
            request_id = run.next_id()
            body = build_request("tasks/get", {"taskId": task_id}, id=request_id)
            answer = await post_raw(run.http, gateway.url, body, headers=creation.caller.auth)
            direct = None
            if route["replica"] == doomed.url:
                # What the owner itself answers to the same request: the gateway relays that.
                direct = await post_raw(run.http, doomed.url, body)
            seen.append(outcome(answer, task_id, direct))
        allowed = allowed_outcomes(run, creation, route)
        since_redis = time.monotonic() - run.weather.faults["redis"][1]
        found.expect(
            seen[0] == seen[1] and seen[0] in allowed,
            f"{task_id} (creation {creation.index}, owner {route['replica']}), "
            f"{since_redis:.1f} s after Redis came back: A answered {seen[0]}, "
            f"B answered {seen[1]}; allowed: {sorted(allowed)}",
        )
        found.seen[task_id] = seen[0]
        found.outcomes[seen[0] if seen[0] in (RESOLVED, OWNER_NOT_FOUND) else "wrong"] += 1

    await bounded(received, check)


async def check_strangers(
    run: Chaos, sample: list[Creation], strangers: dict[str, list[Caller]], found: Check
) -> None:
    """Another tenant's (or principal's) tasks/* get exactly the bytes of a made-up id."""
    methods: list[tuple[str, JsonObject]] = [
        ("tasks/get", {}),
        ("tasks/update", {"inputResponses": {"approve_outline": APPROVE}}),
        ("tasks/cancel", {}),
    ]

    async def check(creation: Creation) -> None:
        assert creation.task_id is not None
        gateway = run.gateways[creation.index % 2 - 1]  # the one that did not create it
        for stranger in strangers[creation.caller.tenant]:
            for method, extra in methods:
                request_id = run.next_id()
                theirs, made_up = [
                    await post_as(
                        run.http, gateway.url, stranger, method, {"taskId": task, **extra},
                        id=request_id,
                    )
                    for task in (creation.task_id, secrets.token_urlsafe(32))
                ]  # fmt: skip
                same = (theirs.status, theirs.raw) == (made_up.status, made_up.raw)
                uniform = theirs.status == 200 and theirs.message.get("error") == UNIFORM_NOT_FOUND
                found.expect(
                    same and uniform,
                    f"{stranger.tenant}/{stranger.subject} {method} of {creation.task_id} "
                    f"({creation.caller.tenant}) answered HTTP {theirs.status} {theirs.raw!r}; "
                    f"a made-up id: HTTP {made_up.status} {made_up.raw!r}",
                )
                found.outcomes["foreign " + method] += 1

    await bounded(sample, check)


async def finish(run: Chaos, gateway: TaskgateProcess, caller: Caller, task_id: str) -> JsonObject:
    """Approve the task's outline through `gateway` and poll it to a terminal status."""
    seen: list[JsonObject] = []

    async def probe() -> JsonObject:
        answer = await run.tasks_get(gateway, caller, task_id)
        result = answer.message.get("result")
        assert answer.status == 200, answer
        assert isinstance(result, dict), answer
        seen.append(result)
        return result

    async def until(statuses: Collection[str]) -> JsonObject:
        try:
            return await poll_until(probe, lambda task: task.get("status") in statuses)
        except TimeoutError:
            last = seen[-1] if seen else None
            raise AssertionError(f"{task_id} never reached {statuses}; last: {last}") from None

    parked = await until({"input_required"})
    (key,) = parked["inputRequests"]
    params = {"taskId": task_id, "inputResponses": {key: APPROVE}}
    answer = await post_as(run.http, gateway.url, caller, "tasks/update", params, id=run.next_id())
    assert answer.status == 200, answer
    assert "result" in answer.message, answer
    return await until(TERMINAL_STATUSES)


async def check_finishing(run: Chaos, sample: list[Creation], routes: Any, found: Check) -> None:
    """A finished task names the replica that ran it: the one its route records."""
    names = {replica.url: name for name, replica in run.replicas.items()}

    async def check(creation: Creation) -> None:
        assert creation.task_id is not None
        gateway = run.gateways[creation.index % 2 - 1]
        done = await finish(run, gateway, creation.caller, creation.task_id)
        owner = names[routes[creation.task_id]["replica"]]
        expected = {"size": creation.size, "approved": True, "replica": owner}
        content = done.get("result", {}).get("structuredContent")
        found.expect(
            done["status"] == "completed" and content == expected,
            f"{creation.task_id} finished as {done!r}; expected {expected}",
        )
        found.outcomes["finished"] += 1

    await bounded(sample, check)


async def check_owner_down(
    run: Chaos, of_doomed: list[Creation], of_others: list[Creation], found: Check
) -> None:
    """With the owner down its tasks are retryable, never another replica's answer, and the
    other replicas' tasks still resolve."""
    run.replicas[DOOMED].kill()
    for creation in of_doomed + of_others:
        assert creation.task_id is not None
        for gateway in run.gateways:
            request_id = run.next_id()
            params = {"taskId": creation.task_id}
            answer = await post_as(
                run.http, gateway.url, creation.caller, "tasks/get", params, id=request_id
            )
            if creation in of_doomed:
                try:
                    assert_retryable(answer, request_id)
                except AssertionError:
                    found.problems.append(f"{creation.task_id}, owner down: {answer!r}")
                found.outcomes["owner down: retryable"] += 1
            else:
                seen = outcome(answer, creation.task_id)
                found.expect(seen == RESOLVED, f"{creation.task_id}, a sibling down: {seen}")
                found.outcomes["sibling down: resolved"] += 1


@pytest.mark.timeout(300)
async def test_every_task_id_handed_out_survives_replica_gateway_and_redis_crashes(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    redis_server = RedisProcess(aof=True)
    replicas: list[BackendProcess] = []
    gateways: list[TaskgateProcess] = []
    weather = Weather()
    try:
        redis_server.start()
        replicas.extend(start_backends(list(REPLICAS)))
        urls = [replica.url for replica in replicas]
        async with (
            running_issuer() as issuer,
            aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as http,
        ):
            for name, port in zip(("A", "B"), free_ports(2), strict=True):
                config = write_gateway_config(
                    tmp_path / f"taskgate-{name}.yaml",
                    port=port,
                    store_url=redis_server.url,
                    replicas=urls,
                    auth=jwt_auth(issuer),
                )
                gateways.append(TaskgateProcess(name, config, port))
            for gateway in gateways:
                gateway.launch()
            for gateway in gateways:
                await gateway.wait_listening()

            def caller(tenant: str, subject: str) -> Caller:
                return Caller(tenant, subject, issuer.token(tenant, subject, lifetime_s=1800))

            alice, gina, mallory = (
                caller("acme", "alice"),
                caller("globex", "gina"),
                caller("acme", "mallory"),
            )
            run = Chaos(
                http,
                gateways[0],
                gateways[1],
                {replica.name: replica for replica in replicas},
                redis_server,
                (alice, gina),
                weather=weather,
            )
            async with asyncio.TaskGroup() as group:
                group.create_task(run.load())
                group.create_task(run.drive())
            loaded = time.monotonic()
            assert set(weather.faults) == {"replica", "gateway", "redis"}
            assert all(gateway.running() for gateway in gateways)

            # What the clients were told: an id, or an error; nothing else.
            assert len(run.ledger) == CREATIONS
            unexpected = [c for c in run.ledger if c.unexpected]
            assert not unexpected, [(c.index, c.gateway, c.unexpected) for c in unexpected]
            received = [c for c in run.ledger if c.task_id is not None]
            errors = Counter(c.error for c in run.ledger if c.error is not None)
            task_ids = [c.task_id for c in received if c.task_id is not None]
            assert len(set(task_ids)) == len(task_ids)

            # Durable before relay: every id handed out has its route, as its creator's.
            routes = await read_routes(redis_server.url, task_ids)
            found = Check()
            for creation in received:
                assert creation.task_id is not None
                route = routes[creation.task_id]
                owner = (route.get("tenant"), route.get("principal"), route.get("backend"))
                caller_was = (creation.caller.tenant, creation.caller.subject, "reports")
                found.expect(
                    owner == caller_was and route.get("replica") in urls,
                    f"{creation.task_id} (creation {creation.index} through "
                    f"{creation.gateway}) has the route {route!r} in Redis",
                )
            assert not found.problems, found.problems[:20]

            await check_resolution(run, received, routes, found)
            assert not found.problems, found.problems[:20]
            resolved = [c for c in received if found.seen[str(c.task_id)] == RESOLVED]
            lost = [c for c in received if found.seen[str(c.task_id)] == OWNER_NOT_FOUND]
            # The faults bit: the dead replica took tasks with it, and the run saw errors.
            assert lost, "no task was lost with the SIGKILLed replica: the fault missed"
            problems = await owner_witnessed(run, lost)
            assert not problems, problems[:20]
            assert errors, "no creation failed: the faults missed"
            assert run.gateway_victim is not None

            # No cross-tenant read, nor a read by another principal of the same tenant.
            strangers = {"acme": [gina, mallory], "globex": [alice]}
            samples = {
                owner.tenant: spread([c for c in resolved if c.caller is owner], routes)
                for owner in run.owners
            }
            foreign = [c for s in samples.values() for c in s[:FOREIGN_PER_TENANT]]
            foreign += [c for owner in run.owners for c in lost if c.caller is owner][:4]
            await check_strangers(run, foreign, strangers, found)
            assert not found.problems, found.problems[:20]

            # No call reached the wrong replica: a finished task names its route's replica.
            # The sample includes tasks strangers just tried to update and cancel.
            finishing = [c for s in samples.values() for c in s[:FINISH_PER_TENANT]]
            await check_finishing(run, finishing, routes, found)

            # With the owner down, its tasks are retryable; the other replicas' still resolve.
            doomed_url = run.replicas[DOOMED].url
            untouched = [c for c in resolved if c not in finishing]
            of_doomed = [c for c in untouched if routes[str(c.task_id)]["replica"] == doomed_url]
            of_doomed = of_doomed[: OWNER_DOWN_SAMPLE // 2] + lost[: OWNER_DOWN_SAMPLE // 2]
            of_others = [c for c in untouched if routes[str(c.task_id)]["replica"] != doomed_url]
            await check_owner_down(run, of_doomed, of_others[:OWNER_DOWN_SAMPLE], found)

            owners = Counter(routes[str(c.task_id)]["replica"] for c in received)
            print(
                f"\nchaos: {CREATIONS} creations in {loaded - started:.1f} s, "
                f"checked in {time.monotonic() - loaded:.1f} s\n"
                f"  created (id received): {len(received)}; errors instead of an id: "
                f"{sum(errors.values())} {dict(errors)}\n"
                f"  resolved through A and B: {len(resolved)}; lost with the SIGKILLed "
                f"replica {DOOMED}: {len(lost)}\n"
                f"  owners: {[owners[url] for url in urls]} "
                f"(r1, r2, r3); A-kill victim {run.gateway_victim.task_id} "
                f"(creation {run.gateway_victim.index})\n"
                "  faults (creations done when it struck, seconds it lasted): "
                + ", ".join(
                    f"{k} {run.struck_at[k]}, {b - a:.2f}" for k, (a, b) in weather.faults.items()
                )
                + f"\n  checks: {dict(found.outcomes)}"
            )
            assert not found.problems, found.problems[:20]
            assert len(resolved) + len(lost) == len(received)
    finally:
        await weather.settle()
        for gateway in gateways:
            gateway.stop()
        stop_all([*replicas, redis_server])
