"""taskgate on a Redis Cluster store: a task created through one instance is resolved through
another, which has only the cluster to learn where it lives."""

from __future__ import annotations

import aiohttp

from gateway.config import StoreConfig
from gateway.store.keys import route_key
from tests.gateway.conftest import REPORT_TOOLS
from tests.gateway.test_tasks import WAITING, create_report
from tests.store.conftest import StoreTarget
from tests.support.gateway import gateway_config, serving
from tests.support.mcp import wait_for_task_status
from tests.support.procs import BackendProcess
from tests.support.redis_topologies import ClusterGroup


async def test_a_task_created_through_a_cluster_store_is_resolved_by_another_instance(
    report_backends: list[BackendProcess],
    redis_cluster: ClusterGroup,
    cluster_target: StoreTarget,
) -> None:
    config = gateway_config(
        {"reports": [b.url for b in report_backends]}, [(REPORT_TOOLS, "reports")]
    )
    # Each route acknowledged by the replica of the master that holds it.
    store = StoreConfig(url=cluster_target.url, durability="wait_replicas", wait_replicas=1)
    config = config.model_copy(update={"store": store})
    async with (
        serving(config) as creator,
        serving(config) as resolver,
        aiohttp.ClientSession() as http,
    ):
        task_ids = [await create_report(http, creator.url) for _ in range(6)]
        for task_id in task_ids:
            task = await wait_for_task_status(http, resolver.url, task_id, WAITING)
            assert task["taskId"] == task_id
        routes = [await resolver.state.tasks.store.lookup(task_id) for task_id in task_ids]
    # Round robin gave both replicas tasks; each poll reached the owner (a misroute answers
    # "Task not found" from a memory:// replica).
    assert {route.replica for route in routes if route is not None} == {
        b.url for b in report_backends
    }
    keys = [route_key(task_id) for task_id in task_ids]
    for key, master in redis_cluster.owners_of(keys).items():
        with master.client() as client:
            assert client.exists(key) == 1, f"{key} is not on the master of its slot"
