"""What an operator sees of the tasks taskgate runs: /metrics and `taskgate task inspect`, from
the store and from the admin listener."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
import yaml

from gateway.config import load_config
from gateway.process.cli import main
from tests.gateway.test_observability import scrape, value
from tests.made.conftest import PLAIN_TOOLS, call, label
from tests.support.gateway import serving
from tests.support.mcp import poll_until, result_of, wait_for_task_status
from tests.support.procs import PlainBackendProcess, free_ports

TERMINAL = frozenset({"completed", "failed", "cancelled"})


def _config(tmp_path: Path, backend: str) -> Path:
    (admin_port,) = free_ports(1)
    path = tmp_path / "taskgate.yaml"
    config = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "store": {"url": f"sqlite:///{tmp_path}/made.db"},
        "admin": {"host": "127.0.0.1", "port": admin_port},
        "backends": {"plain": {"replicas": [backend]}},
        "routes": [{"tools": PLAIN_TOOLS, "backend": "plain", "task": {"mode": "always"}}],
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _inspect(path: Path, task_id: str, *options: str) -> int:
    return main(["task", "inspect", "--config", str(path), *options, "--", task_id])


async def test_metrics_and_inspect_show_a_task_while_it_runs_and_once_it_ended(
    http: aiohttp.ClientSession,
    plain_backend: PlainBackendProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = label()
    path = _config(tmp_path, plain_backend.url)
    async with serving(load_config(path)) as gateway:
        assert gateway.admin_url is not None
        instance = gateway.state.made.holder.instance
        _, response = await call(http, gateway.url, "work", label=job)
        task_id = result_of(response)["taskId"]
        _, running = await scrape(http, gateway.admin_url)

        capsys.readouterr()
        assert await asyncio.to_thread(_inspect, path, task_id) == 0
        from_store = capsys.readouterr().out
        assert await asyncio.to_thread(_inspect, path, task_id, "--admin") == 0
        from_admin = capsys.readouterr().out

        await call(http, plain_backend.url, "release", label=job)
        done = await wait_for_task_status(http, gateway.url, task_id, TERMINAL)
        _, ended = await poll_until(
            lambda: scrape(http, gateway.admin_url or ""),
            lambda scraped: (
                value(scraped[1], "taskgate_made_tasks_total", outcome="completed") == 1
            ),
        )
        assert await asyncio.to_thread(_inspect, path, task_id) == 0
        finished = capsys.readouterr().out

    assert done["status"] == "completed"
    assert value(running, "taskgate_made_tasks_total", outcome="created") == 1
    assert value(running, "taskgate_made_tasks_running") == 1
    assert value(ended, "taskgate_made_tasks_running") == 0
    assert value(ended, "taskgate_made_result_bytes_total") > 0
    for shown in (from_store, from_admin):
        rows = dict(line.split(None, 1) for line in shown.splitlines())
        assert rows["status"] == "working"
        assert rows["holder"] == instance
        assert "renewed" in rows["lease"]
        assert rows["tool"] == "work"
    assert "source     store sqlite" in from_store
    assert "source     admin listener" in from_admin
    rows = dict(line.split(None, 1) for line in finished.splitlines())
    assert rows["status"] == "completed"
    assert rows["lease"] == "- (ended)"
    assert rows["result"].endswith("bytes")
