"""Tasks of a 2025-11-25 server (the TypeScript SDK 1.x's experimental tasks, in
tests/clients/ts1/server.mjs) as the Tasks extension's, for 2026-07-28 clients through
taskgate: created flat and recorded with the session they live in, followed, cancelled, kept
to their owner, through another instance and after a restart; and a client without the
extension getting a task-only tool's answer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.bridge import own_session
from gateway.errors import StoreUnavailable
from gateway.ops.exposition import snapshot
from gateway.protocol.meta import TASKS_EXTENSION
from tests.support.era2025 import ROUTES, Era2025Process, call, exchange, started, text
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.listen import listening, next_event
from tests.support.mcp import poll_until, wait_for_task_status
from tests.support.node import NodeProject

TERMINAL = {"completed", "failed", "cancelled"}
YES = {"action": "accept", "content": {"ok": True}}
NO = {"action": "accept", "content": {"ok": False}}


@pytest.fixture
def ts1(node_project: NodeProject) -> Iterator[Era2025Process]:
    with started("ts-sdk1", node_project) as server:
        yield server


@pytest.fixture
async def gateway(ts1: Era2025Process) -> AsyncIterator[RunningGateway]:
    async with serving(gateway_config({"old": [ts1.url]}, ROUTES)) as running:
        yield running


def report(seconds: float, **more: Any) -> dict[str, Any]:
    return {"name": "report", "arguments": {"seconds": seconds, **more}}


async def settled(url: str, task_id: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        return await wait_for_task_status(http, url, task_id, TERMINAL)


async def test_a_task_of_a_2025_server_is_the_extensions_task(gateway: RunningGateway) -> None:
    discovered = await call(gateway.url, "server/discover", {})
    assert TASKS_EXTENSION in discovered["capabilities"]["extensions"]
    created = await call(gateway.url, "tools/call", report(0.2))
    assert created["resultType"] == "task"
    assert created["status"] == "working"
    assert isinstance(created["ttlMs"], int)
    assert created["pollIntervalMs"] == 100
    assert "task" not in created  # flat, not nested as in 2025-11-25
    task_id = created["taskId"]
    # Recorded before the client saw it, with the session it lives in.
    route = await gateway.state.tasks.store.lookup(task_id)
    assert route is not None
    assert route.session.startswith("2025-11-25 ")
    done = await settled(gateway.url, task_id)
    assert done["status"] == "completed"
    assert done["result"]["resultType"] == "complete"
    assert text(done["result"]) == "report of 0.2s by ts-sdk1"


async def test_an_is_error_result_is_a_completed_task(gateway: RunningGateway) -> None:
    created = await call(gateway.url, "tools/call", report(0, fail=True))
    done = await settled(gateway.url, created["taskId"])
    # 2025-11-25 called it failed; the extension: completed, with the result as it is.
    assert done["status"] == "completed"
    assert done["result"]["isError"] is True
    assert text(done["result"]) == "report failed"


async def test_a_cancelled_task_is_cancelled_upstream(gateway: RunningGateway) -> None:
    created = await call(gateway.url, "tools/call", report(60))
    task = {"taskId": created["taskId"]}
    assert await call(gateway.url, "tasks/cancel", task) == {"resultType": "complete"}
    assert (await call(gateway.url, "tasks/get", task))["status"] == "cancelled"
    # Cancelling an ended task is no error: the extension's cancel may find it ended.
    assert await call(gateway.url, "tasks/cancel", task) == {"resultType": "complete"}


async def test_another_callers_task_is_one_that_does_not_exist(
    ts1: Era2025Process, issuer: Issuer
) -> None:
    config = gateway_config({"old": [ts1.url]}, ROUTES, auth=jwt_auth(issuer))
    alice, bob = issuer.token("acme", "alice"), issuer.token("acme", "bob")
    async with serving(config) as gateway:
        created = await call(gateway.url, "tools/call", report(60), token=alice)
        mine = {"taskId": created["taskId"]}
        for method in ("tasks/get", "tasks/cancel", "tasks/update"):
            params = {**mine, "inputResponses": {}} if method == "tasks/update" else mine
            (theirs,) = await exchange(gateway.url, method, params, token=bob)
            (unknown,) = await exchange(
                gateway.url, method, {**params, "taskId": "no-such-task"}, token=bob
            )
            assert (
                theirs["error"] == unknown["error"] == {"code": -32602, "message": "Task not found"}
            )
        assert (await call(gateway.url, "tasks/get", mine, token=alice))["status"] == "working"


async def test_a_task_made_through_one_instance_is_followed_through_another(
    ts1: Era2025Process, redis_url: str
) -> None:
    config = gateway_config({"old": [ts1.url]}, ROUTES, store=redis_url)
    async with serving(config) as first, serving(config) as second:
        made = await call(first.url, "tools/call", report(0.2))
        assert (await settled(second.url, made["taskId"]))["status"] == "completed"
        long = await call(first.url, "tools/call", report(60))
        cancelled = {"taskId": long["taskId"]}
        assert await call(second.url, "tasks/cancel", cancelled) == {"resultType": "complete"}
        assert (await call(first.url, "tasks/get", cancelled))["status"] == "cancelled"
        # The second instance opened no session of its own for it: it used the route's.
        assert second.state.callers.opened == 0


async def test_a_live_tasks_session_outlives_idleness_and_a_restart(
    ts1: Era2025Process, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path / 'routes.db'}"
    config = gateway_config({"old": [ts1.url]}, ROUTES, store=store)
    async with serving(config) as first:
        made = await call(first.url, "tools/call", report(0.5))
        (table,) = first.state.callers._tables.values()
        (held,) = table.held.values()
        held.used_at -= 3600  # idle for an hour: a call's acquire would end it, but for its task
        assert text(await call(first.url, "tools/call", {"name": "whoami"}, tasks=False))
        assert [h.opened for h in table.held.values()] == [held.opened]
    # taskgate stopped without ending the session: the task's route still reaches it.
    async with serving(config) as second:
        assert (await settled(second.url, made["taskId"]))["status"] == "completed"


async def test_a_client_without_the_extension_gets_the_tools_answer(
    gateway: RunningGateway,
) -> None:
    required = {"name": "report_required", "arguments": {"seconds": 0.1}}
    answered = await call(gateway.url, "tools/call", required, tasks=False)
    assert (answered["resultType"], text(answered)) == ("complete", "report of 0.1s by ts-sdk1")
    # A tool that may run as a task is left to the server, which then runs it inline.
    inline = await call(gateway.url, "tools/call", report(0.1), tasks=False)
    assert text(inline) == "report of 0.1s by ts-sdk1"
    assert await gateway.state.tasks.store.lookup("any") is None


async def test_a_listen_is_told_of_the_task_until_it_ends(gateway: RunningGateway) -> None:
    created = await call(gateway.url, "tools/call", report(0.3))
    task_id = created["taskId"]
    async with (
        aiohttp.ClientSession() as http,
        listening(http, gateway.url, {"taskIds": [task_id]}, id="listen-1") as stream,
    ):
        acknowledged = await next_event(stream)
        assert acknowledged["params"]["notifications"]["taskIds"] == [task_id]
        statuses: list[str] = []
        while not statuses or statuses[-1] not in TERMINAL:
            told = await next_event(stream)
            assert told["method"] == "notifications/tasks"
            assert told["params"]["taskId"] == task_id
            statuses.append(told["params"]["status"])
        assert statuses[-1] == "completed"
        assert text(told["params"]["result"]) == "report of 0.3s by ts-sdk1"


async def test_a_task_whose_route_cannot_be_recorded_is_cancelled_in_its_session(
    gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def down(route: object) -> None:
        raise StoreUnavailable("the task store is down")

    monkeypatch.setattr(gateway.state.tasks.store, "record", down)
    (answer,) = await exchange(gateway.url, "tools/call", report(60))
    assert "could not be recorded, so it was cancelled" in answer["error"]["message"]
    # The client never saw the task: the server, asked in the caller's session, has it
    # cancelled (nothing runs that nobody can reach).
    (table,) = gateway.state.callers._tables.values()
    (held,) = table.held.values()
    replica = gateway.state.backends["old"].replicas[0]

    async def listed() -> list[dict[str, Any]]:
        found = await own_session.ask(
            gateway.state.pool, replica, held.opened, {}, "tasks/list", {}, 5
        )
        tasks: list[dict[str, Any]] = found["tasks"]
        return tasks

    tasks = await poll_until(listed, lambda tasks: [t["status"] for t in tasks] == ["cancelled"])
    assert len(tasks) == 1


ASKS: dict[str, Any] = {"elicitation": {}, "extensions": {TASKS_EXTENSION: {}}}


async def test_a_tasks_questions_are_input_required_answered_by_tasks_update(
    ts1: Era2025Process, redis_url: str
) -> None:
    """The server asks through the task's tasks/result stream; every instance shows what it
    asked and takes the answers."""
    config = gateway_config({"old": [ts1.url]}, ROUTES, store=redis_url)
    meta = {"_meta": {"io.modelcontextprotocol/clientCapabilities": ASKS}}
    async with serving(config) as first, serving(config) as second:
        params = {"name": "approval", "arguments": {"questions": 2}, **meta}
        created = await call(first.url, "tools/call", params)
        task = {"taskId": created["taskId"], **meta}
        answers = [YES, NO]
        for step, through in enumerate((first, second), start=1):
            async with aiohttp.ClientSession() as http:
                asked = await wait_for_task_status(
                    http, through.url, created["taskId"], {"input_required"}
                )
            ((key, question),) = asked["inputRequests"].items()
            # One instance reads the task's tasks/result stream (/metrics says so).
            readers = [snapshot(g.state)["taskgate_bridge_task_readers"] for g in (first, second)]
            assert [[1]] in readers
            assert question["method"] == "elicitation/create"
            assert question["params"]["message"] == f"approve step {step}?"
            assert "_meta" not in question["params"]  # no 2025-11-25 related-task mark
            # The other instance shows the same question, from the store.
            other = second if through is first else first
            again = await call(other.url, "tasks/get", task)
            assert again["inputRequests"] == {key: question}
            update = {**task, "inputResponses": {key: answers[step - 1]}}
            assert await call(other.url, "tasks/update", update) == {"resultType": "complete"}
        done = await settled(first.url, created["taskId"])
        assert (done["status"], text(done["result"])) == ("completed", "yes,no")


async def test_a_replica_restarted_under_two_instances(
    node_project: NodeProject, redis_url: str
) -> None:
    """Two TypeScript replicas behind two instances on one store: one restarts mid-run. Its
    tasks are gone with it (their methods answer as for tasks that never existed, through
    either instance), and the next calls open new sessions, without an error."""
    with (
        started("ts-sdk1", node_project, name="one") as one,
        started("ts-sdk1", node_project, name="two") as two,
    ):
        config = gateway_config({"old": [one.url, two.url]}, ROUTES, store=redis_url)
        async with serving(config) as first, serving(config) as second:
            made = [await call(first.url, "tools/call", report(60)) for _ in range(2)]
            routes = [await first.state.tasks.store.lookup(m["taskId"]) for m in made]
            owners = {route.replica for route in routes if route is not None}
            assert owners == {one.url, two.url}  # one task on each replica
            lost = next(m for m, r in zip(made, routes, strict=True) if r and r.replica == one.url)
            kept = next(m for m in made if m is not lost)
            one.restart()  # the same port; its sessions and tasks are gone
            for gateway in (first, second):
                (gone,) = await exchange(gateway.url, "tasks/get", {"taskId": lost["taskId"]})
                assert gone["error"] == {"code": -32602, "message": "Task not found"}
                alive = await call(gateway.url, "tasks/get", {"taskId": kept["taskId"]})
                assert alive["status"] == "working"
                names = {
                    text(await call(gateway.url, "tools/call", {"name": "whoami"}))
                    for _ in range(2)
                }
                assert names == {"one", "two"}  # new sessions on the restarted one
