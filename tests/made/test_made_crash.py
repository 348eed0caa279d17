"""Tasks taskgate runs, when the instance holding them is killed (SIGKILL), stopped (SIGTERM and
its drain) or restarted: none is lost, none stays `working`, none is finished twice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gateway.store.made import HOLDER_STOPPED
from gateway.store.sqlite_routes import SQLiteRouteStore
from tests.made.conftest import PLAIN_TOOLS, call, label, made_config, stats, task_method
from tests.support.chaos import TaskgateProcess, free_ports
from tests.support.gateway import serving
from tests.support.mcp import poll_until, result_of, wait_for_task_status
from tests.support.procs import LOOPBACK, PlainBackendProcess

TERMINAL = frozenset({"completed", "failed", "cancelled"})
LEASE_S = 2


def _config_file(path: Path, port: int, store: str, backend: str, **listen: Any) -> Path:
    config = {
        "listen": {"host": LOOPBACK, "port": port, **listen},
        "store": {"url": store},
        "tasks": {"made": {"lease_s": LEASE_S}},
        "backends": {"plain": {"replicas": [backend]}},
        "routes": [
            {"tools": ["release", "stats"], "backend": "plain"},
            {
                "tools": [t for t in PLAIN_TOOLS if t not in ("release", "stats")],
                "backend": "plain",
                "task": {"mode": "always"},
            },
        ],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture
def two_gateways(
    tmp_path: Path, redis_url: str, plain_backend: PlainBackendProcess
) -> Iterator[tuple[TaskgateProcess, TaskgateProcess]]:
    ports = free_ports(2)
    gateways = tuple(
        TaskgateProcess(name, _config_file(tmp_path / f"{name}.yaml", port, redis_url,
                                           plain_backend.url), port)
        for name, port in zip(("a", "b"), ports, strict=True)
    )  # fmt: skip
    try:
        yield gateways  # type: ignore[misc]
    finally:
        for gateway in gateways:
            gateway.kill()


async def _started(http: aiohttp.ClientSession, backend: PlainBackendProcess, job: str) -> None:
    await poll_until(lambda: stats(http, backend.url, job), lambda seen: seen["started"] == 1)


async def test_a_killed_holder_leaves_its_task_failed_within_the_lease_through_the_other(
    http: aiohttp.ClientSession,
    plain_backend: PlainBackendProcess,
    two_gateways: tuple[TaskgateProcess, TaskgateProcess],
) -> None:
    a, b = two_gateways
    await a.start()
    await b.start()
    job = label()
    _, held = await call(http, a.url, "work", label=job)
    task_id = result_of(held)["taskId"]
    await _started(http, plain_backend, job)

    a.kill()  # SIGKILL: no drain, no last write
    failed = await wait_for_task_status(http, b.url, task_id, TERMINAL, within=LEASE_S + 10)
    # The killed process's connection closed, which cancels the call at the backend: the tool
    # never finishes for a task that already failed.
    counted = await poll_until(
        lambda: stats(http, plain_backend.url, job), lambda s: s["cancelled"] == 1
    )
    await call(http, plain_backend.url, "release", label=job)
    again = await wait_for_task_status(http, b.url, task_id, TERMINAL)

    assert failed["status"] == "failed"
    assert failed["error"] == {"code": -32603, "message": HOLDER_STOPPED}
    assert failed["statusMessage"] == HOLDER_STOPPED
    assert counted == {"started": 1, "cancelled": 1, "completed": 0}
    assert again == failed


async def test_sigterm_lets_running_tasks_finish_within_the_drain_then_fails_the_rest(
    http: aiohttp.ClientSession, plain_backend: PlainBackendProcess, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path}/made.db"
    (port,) = free_ports(1)
    path = _config_file(tmp_path / "a.yaml", port, store, plain_backend.url, drain_timeout_s=3)
    gateway = TaskgateProcess("a", path, port)
    finishing, stuck = label(), label()
    try:
        await gateway.start()
        _, first = await call(http, gateway.url, "work", label=finishing)
        _, second = await call(http, gateway.url, "work", label=stuck)
        ids = [result_of(first)["taskId"], result_of(second)["taskId"]]
        for job in (finishing, stuck):
            await _started(http, plain_backend, job)
        gateway.terminate()  # SIGTERM: the drain begins
        await call(http, plain_backend.url, "release", label=finishing)
        assert await gateway.exited() == 0
        # What the drain wrote itself, read before any instance could fail a lapsed lease
        left = SQLiteRouteStore(tmp_path / "made.db", timeout_s=2)
        await left.open()
        try:
            records = [await left.made().get_owned(i, "", None) for i in ids]
        finally:
            await left.close()
        assert [r.status if r else None for r in records] == ["completed", "failed"]
        # A new instance on the same store answers what the stopped one left.
        await gateway.start()
        ended = [await wait_for_task_status(http, gateway.url, i, TERMINAL) for i in ids]
    finally:
        gateway.kill()

    assert ended[0]["status"] == "completed"
    assert ended[0]["result"]["structuredContent"]["label"] == finishing
    assert ended[1]["status"] == "failed"
    assert ended[1]["error"]["message"] == HOLDER_STOPPED


async def test_a_completed_task_is_answered_after_a_restart_and_gone_after_its_ttl(
    http: aiohttp.ClientSession, plain_backend: PlainBackendProcess, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path}/made.db"
    config = made_config([plain_backend.url], store=store, ttl_s=2)
    async with serving(config) as before:
        _, response = await call(http, before.url, "quick", text="kept")
        task_id = result_of(response)["taskId"]
        done = await wait_for_task_status(http, before.url, task_id, TERMINAL)
    async with serving(config) as after:
        kept = result_of(await task_method(http, after.url, "tasks/get", task_id))
        gone = await poll_until(
            lambda: task_method(http, after.url, "tasks/get", task_id),
            lambda answer: "error" in answer,
            within=10,
        )

    assert kept == done
    assert gone["error"] == {"code": -32602, "message": "Task not found"}
