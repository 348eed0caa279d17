"""taskIds pushed over taskgate's own upstream listens to the owning replica (issue 13, item 3),
against real backends: two replicas of the `mcp` SDK's MCPServer (backends/pushing.py, with a
hand-rolled Tasks extension whose `notifications/tasks` it pushes) as `jobs`, and the FastMCP
4.1.4 report replicas (which answer listen with 404) as `reports`. The downstream
acknowledgement names every owned id; a task its owner acknowledged is relayed, each snapshot
equal to tasks/get's, and polled once only, for its state when the listen starts; the FastMCP
one is polled; a dropped upstream listen is
re-opened and followed by one fresh snapshot; a restarted owner that forgot its task ends
taskgate's interest in it and nothing else; the client's close ends every upstream listen."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from functools import partial
from typing import Any

import aiohttp
import pytest

from gateway.listen.upstream import UpstreamListens
from tests.gateway.conftest import REPORT_TOOLS
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.listen import (
    ListenStream,
    listening,
    next_event,
    replica_tool,
    streams_become,
    subscription_id,
)
from tests.support.mcp import mcp_call, poll_until, result_of
from tests.support.procs import BackendProcess, PushingBackendProcess, start_backends, stop_all

WITHIN = 20.0  # seconds any one expected event or condition may take
TASKS = "notifications/tasks"
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"


@pytest.fixture(scope="module")
def jobs_backends() -> Iterator[list[PushingBackendProcess]]:
    """Two MCPServer replicas, "j1" and "j2", each with its tasks in its own memory."""
    backends = start_backends(["j1", "j2"], pushing=True)
    try:
        yield [b for b in backends if isinstance(b, PushingBackendProcess)]
    finally:
        stop_all(backends)


@pytest.fixture
async def gateway(
    issuer: Issuer,
    jobs_backends: list[PushingBackendProcess],
    report_backends: list[BackendProcess],
) -> AsyncIterator[RunningGateway]:
    config = gateway_config(
        {"jobs": [j.url for j in jobs_backends], "reports": [r.url for r in report_backends]},
        [
            (["long_job"], "jobs"),
            (REPORT_TOOLS, "reports"),
            {"resources": ["notes://*"], "backend": "jobs"},
        ],
        auth=jwt_auth(issuer),
        subscriptions={"min_poll_interval_ms": 50, "default_poll_interval_ms": 100},
    )
    async with serving(config) as running:
        yield running
        async with asyncio.timeout(WITHIN):
            await running.state.listens.idle.wait()  # the last stream's end has run


def upstream_of(gateway: RunningGateway) -> UpstreamListens:
    return gateway.state.listens.upstream


# --- talking to taskgate and to the replicas ---------------------------------------------------


async def create_job(http: aiohttp.ClientSession, gateway: RunningGateway, token: str) -> str:
    """A long_job task, created through taskgate (the jobs replicas take turns)."""
    params = {"name": "long_job", "arguments": {"steps": 3}}
    answer = await mcp_call(http, gateway.url, "tools/call", params, token=token)
    assert answer.status == 200, answer.raw
    created = result_of(answer.message)
    assert created["resultType"] == "task"
    assert created["status"] == "working"
    task_id: str = created["taskId"]
    return task_id


async def owner_of(
    gateway: RunningGateway, replicas: list[PushingBackendProcess], task_id: str
) -> PushingBackendProcess:
    """The replica taskgate recorded as the task's owner."""
    route = await gateway.state.tasks.store.lookup(task_id)
    assert route is not None
    (owner,) = [replica for replica in replicas if replica.url == route.replica]
    return owner


async def task_get(
    http: aiohttp.ClientSession, gateway: RunningGateway, token: str, task_id: str
) -> dict[str, Any]:
    """tasks/get through taskgate, as notifications/tasks carries it: less resultType, _meta."""
    answer = await mcp_call(http, gateway.url, "tasks/get", {"taskId": task_id}, token=token)
    assert answer.status == 200, answer.raw
    result = result_of(answer.message)
    assert result["resultType"] == "complete"
    return {k: v for k, v in result.items() if k not in ("resultType", "_meta")}


async def advance(
    http: aiohttp.ClientSession, replica: PushingBackendProcess, task_id: str, status: str
) -> dict[str, Any]:
    """Move a task on its replica, which pushes notifications/tasks to its listens."""
    return await replica_tool(http, replica, "advance", task_id=task_id, status=status)


async def stats(http: aiohttp.ClientSession, replica: PushingBackendProcess) -> dict[str, Any]:
    """{replica, tasks, gets (tasks/get calls it was sent), listens (served since it started),
    task_streams (open listens watching a task)}."""
    return await replica_tool(http, replica, "jobs_stats")


async def gets(http: aiohttp.ClientSession, replicas: list[PushingBackendProcess]) -> list[int]:
    return [(await stats(http, replica))["gets"] for replica in replicas]


async def counted(upstream: UpstreamListens) -> dict[str, Any]:
    """taskgate's own count of its open upstream listen answers."""
    return {"listens": upstream.listens, "streams": upstream.streams}


async def acknowledged(stream: ListenStream, listen_id: int | str) -> dict[str, Any]:
    """The acknowledgement's `notifications`, checking it comes first."""
    assert stream.status == 200
    ack = await next_event(stream)
    assert ack["method"] == ACKNOWLEDGED, ack
    assert subscription_id(ack) == listen_id
    notifications: dict[str, Any] = ack["params"]["notifications"]
    return notifications


async def task_event(stream: ListenStream, listen_id: int | str) -> dict[str, Any]:
    """The next event, a notifications/tasks tagged with the listen's id; its params less _meta."""
    event = await next_event(stream)
    assert event["method"] == TASKS, event
    assert subscription_id(event) == listen_id
    assert type(subscription_id(event)) is type(listen_id)
    return {k: v for k, v in event["params"].items() if k != "_meta"}


async def event_for(stream: ListenStream, listen_id: int | str, task_id: str) -> dict[str, Any]:
    """The next notifications/tasks for `task_id`, skipping those of other tasks."""
    while True:
        params = await task_event(stream, listen_id)
        if params["taskId"] == task_id:
            return params


async def first_snapshots(
    stream: ListenStream, listen_id: int | str, count: int
) -> dict[str, dict[str, Any]]:
    """The first `count` notifications/tasks, by task id: each task's current snapshot, which a
    pushed task gets from one tasks/get of taskgate's (as a polled one does from its poller)."""
    found: dict[str, dict[str, Any]] = {}
    for _ in range(count):
        params = await task_event(stream, listen_id)
        found[params["taskId"]] = params
    assert len(found) == count
    return found


# --- pushed, polled only once for the current state -------------------------------------------


async def test_tasks_on_both_replicas_are_pushed_each_snapshot_equal_to_tasks_get_not_polled(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    jobs_backends: list[PushingBackendProcess],
) -> None:
    hub = gateway.state.listens
    upstream = upstream_of(gateway)
    ann, bob = issuer.token("acme", "ann"), issuer.token("acme", "bob")
    tasks = [await create_job(http, gateway, ann) for _ in range(2)]
    owners = [await owner_of(gateway, jobs_backends, task_id) for task_id in tasks]
    assert {owner.name for owner in owners} == {"j1", "j2"}, "the replicas take turns"
    foreign = await create_job(http, gateway, bob)
    asked = [tasks[0], foreign, "no-such-task", tasks[1]]
    before = await gets(http, jobs_backends)
    made = dict.fromkeys((j.name for j in jobs_backends), 0)  # the test's own tasks/get calls

    async with listening(http, gateway.url, {"taskIds": asked}, id="push", token=ann) as stream:
        # bob's task and the bogus id are left out alike; only the two are named
        assert await acknowledged(stream, "push") == {"taskIds": tasks}
        assert hub.pollers == 0  # both owners acknowledged: nothing is polled
        assert upstream.streams == 2  # one upstream listen per owning replica
        # each task's current state first, from one tasks/get of taskgate's
        first = await first_snapshots(stream, "push", 2)
        for task_id, owner in zip(tasks, owners, strict=True):
            assert first[task_id] == await task_get(http, gateway, ann, task_id)
            assert first[task_id]["status"] == "working"
            made[owner.name] += 2  # taskgate's one, and the test's
        for owner in owners:
            assert (await stats(http, owner))["task_streams"] == 1
        for status in ("input_required", "completed"):
            for task_id, owner in zip(tasks, owners, strict=True):
                moved = await advance(http, owner, task_id, status)
                pushed = await task_event(stream, "push")
                # the task as tasks/get (through taskgate) returns it now, lastUpdatedAt included:
                # this backend stamps it when the task moves, not when it is read
                now = await task_get(http, gateway, ann, task_id)
                made[owner.name] += 1
                assert pushed == now == moved
                assert pushed["status"] == status
                assert hub.pollers == 0
        assert "inputRequests" not in pushed
        assert pushed["result"]["isError"] is False
        # A terminal snapshot ends taskgate's interest: the upstream listens close while the
        # client's stream stays open, and nothing more is sent.
        await poll_until(
            partial(counted, upstream), lambda found: found["streams"] == 0, within=WITHIN
        )
        await streams_become(http, jobs_backends, 0)
        assert not stream.ended
    after = await gets(http, jobs_backends)
    # beyond the one per task at the start, taskgate sent no tasks/get: the rest were the test's
    assert [a - b for a, b in zip(after, before, strict=True)] == [
        made[j.name] for j in jobs_backends
    ]


async def test_a_mixed_listen_polls_the_fastmcp_task_and_pushes_the_jobs_task(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    jobs_backends: list[PushingBackendProcess],
) -> None:
    hub = gateway.state.listens
    ann = issuer.token("acme", "ann")
    params = {"name": "generate_report", "arguments": {"size": "small"}}
    answer = await mcp_call(http, gateway.url, "tools/call", params, token=ann)
    report = result_of(answer.message)
    assert report["resultType"] == "task", report
    job = await create_job(http, gateway, ann)
    owner = await owner_of(gateway, jobs_backends, job)
    before = await gets(http, jobs_backends)
    asked = [report["taskId"], job]

    async with listening(http, gateway.url, {"taskIds": asked}, id=8, token=ann) as stream:
        assert await acknowledged(stream, 8) == {"taskIds": asked}  # both, in the client's order
        # FastMCP answered the upstream listen with 404: its task is polled, the job is pushed
        assert hub.pollers == 1
        assert upstream_of(gateway).streams == 1
        # each task's current state first: the poller's, and one tasks/get of the job's owner
        first = await first_snapshots(stream, 8, 2)
        assert first[report["taskId"]]["status"] in ("working", "input_required")
        assert first[job]["status"] == "working"
        moved = await advance(http, owner, job, "input_required")
        assert await event_for(stream, 8, job) == moved == await task_get(http, gateway, ann, job)
        assert hub.pollers == 1
    after = await gets(http, jobs_backends)
    assert sum(after) - sum(before) == 2  # taskgate's one at the start, and the test's


# --- upstream drops ----------------------------------------------------------------------------


async def test_a_dropped_upstream_listen_is_reopened_and_followed_by_one_fresh_snapshot(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    jobs_backends: list[PushingBackendProcess],
) -> None:
    ann = issuer.token("acme", "ann")
    job = await create_job(http, gateway, ann)
    owner = await owner_of(gateway, jobs_backends, job)
    async with listening(http, gateway.url, {"taskIds": [job]}, id=9, token=ann) as stream:
        assert await acknowledged(stream, 9) == {"taskIds": [job]}
        assert (await task_event(stream, 9))["status"] == "working"  # its state at the start
        moved = await advance(http, owner, job, "input_required")
        assert await task_event(stream, 9) == moved
        seen = await stats(http, owner)
        # The replica ends its listen streams gracefully (their result), keeping its tasks:
        # taskgate listens again after its backoff, and, nothing being replayed, sends what
        # tasks/get says now, from one tasks/get of its own.
        assert (await replica_tool(http, owner, "end_listens"))["ended"] == 1
        fresh = await task_event(stream, 9)
        assert fresh == moved == await task_get(http, gateway, ann, job)
        now = await stats(http, owner)
        assert now["listens"] == seen["listens"] + 1
        assert now["gets"] == seen["gets"] + 2  # taskgate's one, and the test's
        assert gateway.state.listens.pollers == 0
        # and the re-opened listen relays what follows
        done = await advance(http, owner, job, "completed")
        assert await task_event(stream, 9) == done


async def test_a_restarted_owner_that_forgot_its_task_ends_only_that_tasks_relay(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    jobs_backends: list[PushingBackendProcess],
) -> None:
    hub = gateway.state.listens
    upstream = upstream_of(gateway)
    ann = issuer.token("acme", "ann")
    tasks = [await create_job(http, gateway, ann) for _ in range(2)]
    lost, kept = tasks
    owners = [await owner_of(gateway, jobs_backends, task_id) for task_id in tasks]
    restarted, other = owners
    assert restarted is not other
    try:
        async with listening(http, gateway.url, {"taskIds": tasks}, id=10, token=ann) as stream:
            assert await acknowledged(stream, 10) == {"taskIds": tasks}
            assert set(await first_snapshots(stream, 10, 2)) == set(tasks)
            assert upstream.streams == 2
            await asyncio.to_thread(restarted.kill)  # SIGKILL: its listen breaks off
            await asyncio.to_thread(restarted.start)  # on the same port, its memory empty
            # taskgate listens again (with backoff); the replica acknowledges no task (it knows
            # none), so taskgate closes that listen and sends nothing for the lost task
            await poll_until(
                partial(stats, http, restarted),
                lambda found: found["listens"] >= 1 and found["task_streams"] == 0,
                within=WITHIN,
            )
            await streams_become(http, [restarted], 0)
            await poll_until(
                partial(counted, upstream), lambda found: found["streams"] == 1, within=WITHIN
            )
            assert hub.pollers == 0  # the lost task is not handed to a poller either
            # What the client sees of the lost task: no event, and tasks/get says it is gone
            answer = await mcp_call(http, gateway.url, "tasks/get", {"taskId": lost}, token=ann)
            assert answer.message["error"]["code"] == -32602
            # The other task is relayed as before
            moved = await advance(http, other, kept, "completed")
            assert await task_event(stream, 10) == moved
    finally:
        if restarted.returncode is not None:
            await asyncio.to_thread(restarted.start)


async def test_one_listen_per_replica_carries_uris_and_task_ids_and_the_close_ends_them_all(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    jobs_backends: list[PushingBackendProcess],
) -> None:
    hub = gateway.state.listens
    upstream = upstream_of(gateway)
    await streams_become(http, jobs_backends, 0)  # what earlier tests held is gone
    ann = issuer.token("acme", "ann")
    tasks = [await create_job(http, gateway, ann) for _ in range(2)]
    owners = [await owner_of(gateway, jobs_backends, task_id) for task_id in tasks]
    notifications = {"resourceSubscriptions": ["notes://a"], "taskIds": tasks}
    async with listening(http, gateway.url, notifications, id=11, token=ann) as stream:
        assert await acknowledged(stream, 11) == notifications
        assert set(await first_snapshots(stream, 11, 2)) == set(tasks)
        # notes://a goes to every replica, each task to its owner: one listen per replica
        await streams_become(http, jobs_backends, 1)
        assert (upstream.listens, upstream.streams, hub.pollers) == (1, 2, 0)
        await replica_tool(http, owners[1], "touch", uri="notes://a")
        event = await next_event(stream)
        assert event["method"] == "notifications/resources/updated"
        assert event["params"] == {
            "uri": "notes://a",
            "_meta": {"io.modelcontextprotocol/subscriptionId": 11},
        }
        moved = await advance(http, owners[0], tasks[0], "input_required")
        assert await task_event(stream, 11) == moved
    async with asyncio.timeout(WITHIN):
        await hub.idle.wait()  # the stream's end ran: its upstream listens are closed
    assert (upstream.listens, upstream.streams) == (0, 0)
    await streams_become(http, jobs_backends, 0)  # and each replica saw its stream end
