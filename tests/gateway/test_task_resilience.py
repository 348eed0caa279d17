"""Task routes survive what a fleet goes through: several gateways, restarts, dead replicas."""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from pathlib import Path

import aiohttp
import orjson
import pytest

from gateway.config import Config
from tests.gateway.conftest import REPORT_TOOLS
from tests.support.gateway import gateway_config, serving
from tests.support.procs import BackendProcess, start_backends, stop_all
from tests.support.tasks import (
    UNFINISHED,
    approve_and_finish,
    assert_retryable,
    create_report,
    get_task,
    next_id,
    post,
)


def reports_config(replicas: list[str], *, store: str, affinity: str = "replica") -> Config:
    """taskgate in front of one `reports` backend with these replica URLs."""
    config = gateway_config({"reports": replicas}, [(REPORT_TOOLS, "reports")], store=store)
    backend = config.backends["reports"].model_copy(update={"task_affinity": affinity})
    return config.model_copy(update={"backends": {"reports": backend}})


@pytest.fixture(params=["sqlite", "redis"])
def durable_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL that outlives a gateway: a SQLite file, or the test's Redis."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/routes.db"
    url: str = request.getfixturevalue("redis_url")
    return url


async def test_two_gateways_sharing_redis_serve_each_others_tasks(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess], redis_url: str
) -> None:
    config = reports_config([b.url for b in report_backends], store=redis_url)
    limit = asyncio.Semaphore(16)

    async with serving(config) as a, serving(config) as b:

        async def create_on_a_get_on_b(n: int) -> str:
            async with limit:
                created = await create_report(http, a.url, f"size-{n}")
                # No pause: the route must be durable before A relayed the id (invariant 1,
                # docs/architecture.md).
                task = await get_task(http, b.url, created["taskId"])
                assert task["status"] in UNFINISHED, task
                return str(created["taskId"])

        # A TaskGroup: the first failure cancels the rest instead of leaving them running.
        async with asyncio.timeout(30), asyncio.TaskGroup() as group:
            pending = [group.create_task(create_on_a_get_on_b(n)) for n in range(200)]
        task_ids = [done.result() for done in pending]

        assert len(set(task_ids)) == 200
        routes = [await b.state.tasks.store.lookup(task_id) for task_id in task_ids]
        owners = Counter(route.replica for route in routes if route is not None)
    assert sum(owners.values()) == 200
    assert set(owners) == {backend.url for backend in report_backends}


async def test_a_gateway_restart_loses_no_route(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess], durable_store: str
) -> None:
    config = reports_config([b.url for b in report_backends], store=durable_store)
    names = {backend.url: backend.name for backend in report_backends}

    async with serving(config) as before:
        created = [await create_report(http, before.url, f"restart-{n}") for n in range(4)]
        task_ids = [task["taskId"] for task in created]
        routes = [await before.state.tasks.store.lookup(task_id) for task_id in task_ids]
    owners = {route.task_id: names[route.replica] for route in routes if route is not None}
    assert set(owners) == set(task_ids)
    assert set(owners.values()) == {"r1", "r2"}

    async with serving(config) as after:
        for task_id in task_ids:
            assert (await get_task(http, after.url, task_id))["status"] in UNFINISHED
        done = await approve_and_finish(http, after.url, task_ids[0])

    assert done["status"] == "completed"
    expected = {"size": "restart-0", "approved": True, "replica": owners[task_ids[0]]}
    assert done["result"]["structuredContent"] == expected


async def test_an_unreachable_owner_is_retryable_and_other_replicas_are_unaffected(
    http: aiohttp.ClientSession,
) -> None:
    replicas = start_backends(["doomed", "survivor"])
    try:
        urls = [replica.url for replica in replicas]
        doomed, survivor = replicas
        async with serving(reports_config(urls, store="sqlite:///:memory:")) as gateway:
            owned: dict[str, str] = {}  # replica URL -> a task it owns
            for n in range(8):
                if len(owned) == len(urls):
                    break
                task_id = (await create_report(http, gateway.url, f"owned-{n}"))["taskId"]
                route = await gateway.state.tasks.store.lookup(task_id)
                assert route is not None
                owned.setdefault(route.replica, task_id)
            assert set(owned) == set(urls)

            doomed_task, surviving_task = owned[doomed.url], owned[survivor.url]
            doomed.kill()

            for _ in range(3):
                request_id = next_id()
                answer = await post(
                    http, gateway.url, "tasks/get", {"taskId": doomed_task}, id=request_id
                )
                assert_retryable(answer, request_id)  # never -32602: the task is not gone

            assert (await get_task(http, gateway.url, surviving_task))["status"] in UNFINISHED
            done = await approve_and_finish(http, gateway.url, surviving_task)
        assert done["status"] == "completed"
        assert done["result"]["structuredContent"]["replica"] == "survivor"
    finally:
        stop_all(replicas)


async def test_backend_affinity_lets_any_replica_serve_a_shared_task_store(
    http: aiohttp.ClientSession, redis_url: str
) -> None:
    # FastMCP's tasks (Docket) live in database 1; the gateway's routes in database 0.
    shared_tasks = redis_url.rsplit("/", 1)[0] + "/1"
    replicas = start_backends(["shared-a", "shared-b"], tasks_url=shared_tasks)
    try:
        urls = [replica.url for replica in replicas]
        by_url = {replica.url: replica for replica in replicas}
        any_replica = reports_config(urls, store=redis_url, affinity="backend")
        owner_only = reports_config(urls, store=redis_url)  # the default, task_affinity: replica
        async with serving(any_replica) as shared, serving(owner_only) as pinned:
            task_id = (await create_report(http, shared.url, "shared"))["taskId"]
            route = await shared.state.tasks.store.lookup(task_id)
            assert route is not None
            owner = by_url[route.replica]
            (other,) = (replica for replica in replicas if replica is not owner)
            assert (await get_task(http, pinned.url, task_id))["status"] in UNFINISHED

            owner.kill()

            # Every poll resolves, whichever replica's turn it is: the owner is not needed.
            for _ in range(4):
                assert (await get_task(http, shared.url, task_id))["status"] in UNFINISHED
            # The counter-test: pinned to its dead owner, the same task is a retryable 503.
            request_id = next_id()
            answer = await post(http, pinned.url, "tasks/get", {"taskId": task_id}, id=request_id)
            assert_retryable(answer, request_id)

            done = await approve_and_finish(http, shared.url, task_id)
        assert done["status"] == "completed"
        expected = {"size": "shared", "approved": True, "replica": other.name}
        assert done["result"]["structuredContent"] == expected
    finally:
        stop_all(replicas)


@pytest.mark.parametrize("store", ["sqlite", "redis"])
async def test_a_task_created_through_the_gateway_expires_with_its_route(
    http: aiohttp.ClientSession,
    report_backends: list[BackendProcess],
    request: pytest.FixtureRequest,
    store: str,
) -> None:
    url = "sqlite:///:memory:" if store == "sqlite" else request.getfixturevalue("redis_url")
    async with serving(reports_config([b.url for b in report_backends], store=url)) as gateway:
        task_id = (await create_report(http, gateway.url, "expiring"))["taskId"]
        assert (await get_task(http, gateway.url, task_id))["status"] in UNFINISHED

        await gateway.expire_route(task_id)

        expired = await post(http, gateway.url, "tasks/get", {"taskId": task_id}, id="same")
        never = secrets.token_urlsafe(32)
        unknown = await post(http, gateway.url, "tasks/get", {"taskId": never}, id="same")

    assert expired.status == unknown.status == 200
    assert orjson.loads(expired.raw)["error"] == {"code": -32602, "message": "Task not found"}
    assert expired.raw == unknown.raw
