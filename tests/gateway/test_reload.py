"""Reloading the configuration without a restart: SIGHUP, POST /reload and `taskgate reload`,
in one process and with workers; what is refused, and what a reload leaves alone."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gateway.config import ConfigError, load_config
from gateway.ops.reload_changes import needs_restart
from gateway.process.serve import Running, Source, running
from tests.support.chaos import TaskgateProcess
from tests.support.gateway import gateway_config, serving
from tests.support.mcp import build_request, poll_until, post_raw
from tests.support.procs import REPO_ROOT, BackendProcess, free_ports
from tests.support.tasks import assert_retryable, create_report, get_task, next_id

RELOADED = re.compile(r"\[(\d+)\] reloaded .* \((SIGHUP|admin); version ")
ANSWERED = re.compile(r"taskgate\.access \[(\d+)\] method=tools/call status=200 ")


def document(replicas: list[BackendProcess], tools: list[str], **sections: Any) -> dict[str, Any]:
    """A configuration file's content: one backend `reports`, `tools` routed to it."""
    return {
        "backends": {"reports": {"replicas": [r.url for r in replicas]}},
        "routes": [{"tools": tools, "backend": "reports"}],
        **sections,
    }


class TaskgateRun(TaskgateProcess):
    """`taskgate run --config FILE [--workers N]` as a subprocess, with its admin listener."""

    def __init__(self, tmp_path: Path, content: dict[str, Any], *, workers: int = 1) -> None:
        port, admin = free_ports(2)
        self.workers = workers
        self.admin_url = f"http://127.0.0.1:{admin}"
        self.fixed: dict[str, dict[str, Any]] = {
            "listen": {"host": "127.0.0.1", "port": port},
            "admin": {"host": "127.0.0.1", "port": admin},
            "store": {"url": f"sqlite:///{tmp_path}/routes-{port}.db"},
        }
        path = tmp_path / f"taskgate-{port}.yaml"
        super().__init__(f"reload-{port}", path, port, args=("--workers", str(workers)))
        self.write(content)

    def write(self, content: dict[str, Any]) -> None:
        """Edit the file: `content` beside the listeners and store it was started with."""
        merged = {**self.fixed, **content}
        merged["listen"] = {**self.fixed["listen"], **content.get("listen", {})}
        self.config.write_text(yaml.safe_dump(merged))

    def hangup(self) -> None:
        os.kill(self.pid, signal.SIGHUP)

    async def reloads(self, count: int, since: int = 0) -> list[tuple[str, str]]:
        """Wait for `count` "reloaded" lines after `since` characters of the log: (pid,
        trigger) of each."""

        async def probe() -> list[tuple[str, str]]:
            return RELOADED.findall(self.log_text()[since:])

        return await poll_until(probe, lambda found: len(found) >= count, within=20)


@asynccontextmanager
async def taskgate(
    tmp_path: Path, content: dict[str, Any], *, workers: int = 1
) -> AsyncIterator[TaskgateRun]:
    process = TaskgateRun(tmp_path, content, workers=workers)
    await process.start()
    try:
        if workers > 1:  # every worker listening, so that fresh connections reach them all

            async def listening() -> int:
                return process.log_text().count("listening on")

            await poll_until(listening, lambda n: n >= workers, within=30)
        yield process
    finally:
        process.stop()


async def call_tool(
    http: aiohttp.ClientSession, url: str, tool: str, arguments: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One tools/call; its JSON-RPC answer."""
    body = build_request("tools/call", {"name": tool, "arguments": arguments or {}}, id=next_id())
    answer = await post_raw(http, url, body)
    return answer.message


async def whoami(http: aiohttp.ClientSession, url: str) -> str:
    message = await call_tool(http, url, "whoami")
    replica: str = message["result"]["structuredContent"]["replica"]
    return replica


async def taskgate_reload(config: Path) -> tuple[int, str]:
    """`taskgate reload --config FILE`: its exit code and everything it printed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "gateway", "reload", "--config", str(config)),
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(30):
            output, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, output.decode()


async def post_reload(http: aiohttp.ClientSession, admin_url: str) -> tuple[int, dict[str, Any]]:
    # The header the admin listener requires of a POST (a browser cannot send it cross-site).
    async with http.post(admin_url + "/reload", headers={"X-Taskgate-Admin": "1"}) as response:
        body: dict[str, Any] = await response.json()
        return response.status, body


# -- taskgate run, reloaded by SIGHUP ------------------------------------------------------


async def test_sighup_applies_an_edited_file_a_new_route_and_replica_and_keeps_serving(
    http: aiohttp.ClientSession, tmp_path: Path, r1: BackendProcess, r2: BackendProcess
) -> None:
    async with taskgate(tmp_path, document([r1], ["echo"])) as gateway:
        unknown = await call_tool(http, gateway.url, "whoami")
        assert unknown["error"]["code"] == -32602  # not routed yet
        gateway.write(document([r1, r2], ["echo", "whoami"]))
        gateway.hangup()
        ((_, trigger),) = await gateway.reloads(1)
        assert trigger == "SIGHUP"
        log = gateway.log_text()
        assert f"replica 127.0.0.1:{r2.port} added" in log
        assert "routes changed (1 -> 1)" in log
        # The new tool answers, from both replicas now (round robin over the new one).
        seen = {await whoami(http, gateway.url) for _ in range(4)}
        assert seen == {"r1", "r2"}
        echo = await call_tool(http, gateway.url, "echo", {"text": "still"})
        assert echo["result"]["structuredContent"] == {"result": "still"}
        assert gateway.running()
        status, body = await post_reload(http, gateway.admin_url)
        assert status == 200
        assert body["applied"] is True
        assert body["changes"] == [
            "no change to the configuration (credentials and keys read again)"
        ]


async def test_an_edit_taskgate_check_refuses_is_refused_in_its_words_and_the_old_routes_serve(
    http: aiohttp.ClientSession, tmp_path: Path, r1: BackendProcess
) -> None:
    async with taskgate(tmp_path, document([r1], ["echo"])) as gateway:
        broken = document([r1], ["echo", "whoami"])
        broken["routes"].append({"tools": ["stats"], "backend": "nowhere"})
        gateway.write(broken)
        with pytest.raises(ConfigError) as checked:
            load_config(gateway.config)
        (problem,) = checked.value.problems
        assert problem == "routes[1].backend: unknown backend 'nowhere'"
        gateway.hangup()

        async def warned() -> str:
            return gateway.log_text()

        log = await poll_until(warned, lambda text: problem in text, within=20)
        assert "WARNING" in next(line for line in log.splitlines() if problem in line)
        status, body = await post_reload(http, gateway.admin_url)
        assert status == 400
        assert body["applied"] is False
        assert body["problems"] == [problem]
        # The running configuration is untouched: echo serves, whoami is still not routed.
        echo = await call_tool(http, gateway.url, "echo", {"text": "kept"})
        assert echo["result"]["structuredContent"] == {"result": "kept"}
        assert (await call_tool(http, gateway.url, "whoami"))["error"]["code"] == -32602
        assert gateway.running()


async def test_taskgate_reload_prints_what_changed_or_each_problem(
    http: aiohttp.ClientSession, tmp_path: Path, r1: BackendProcess, r2: BackendProcess
) -> None:
    async with taskgate(tmp_path, document([r1], ["echo"])) as gateway:
        gateway.write(document([r1, r2], ["echo", "whoami"]))
        code, output = await taskgate_reload(gateway.config)
        assert code == 0, output
        assert f"taskgate: reloaded {gateway.config} (version " in output
        assert f"  backend reports: replica 127.0.0.1:{r2.port} added" in output
        assert await whoami(http, gateway.url) in {"r1", "r2"}

        (other_port,) = free_ports(1)
        gateway.write(document([r1], ["echo"], listen={"port": other_port}))
        code, output = await taskgate_reload(gateway.config)
        assert code == 1
        assert "was not applied; taskgate keeps running version" in output
        assert f"  listen.port: {gateway.port} -> {other_port}: the listener's address" in output
        # Refused: r2 and whoami, applied before, still serve.
        assert {await whoami(http, gateway.url) for _ in range(4)} == {"r1", "r2"}

        gateway.write({"routes": [], "backends": {}})
        code, output = await taskgate_reload(gateway.config)
        assert code == 1
        assert "is not a valid configuration" in output  # check's own words, from the file


async def test_taskgate_reload_says_so_when_nothing_listens_on_the_admin_port(
    tmp_path: Path, r1: BackendProcess
) -> None:
    port, admin = free_ports(2)
    path = tmp_path / "idle.yaml"
    content = {
        "listen": {"port": port},
        "admin": {"port": admin},
        **document([r1], ["echo"]),
    }
    path.write_text(yaml.safe_dump(content))
    code, output = await taskgate_reload(path)
    assert code == 1
    assert f"taskgate: nothing answers at http://127.0.0.1:{admin}/reload" in output
    path.write_text(yaml.safe_dump(document([r1], ["echo"])))
    code, output = await taskgate_reload(path)
    assert code == 1
    assert "has no admin section" in output


# -- with workers -----------------------------------------------------------------------------


async def answered_by(gateway: TaskgateRun, tool: str, since: int, calls: int = 24) -> set[str]:
    """`calls` calls of `tool`, each on a fresh connection (SO_REUSEPORT spreads them over the
    workers); every one answered, and the pids of the workers whose request log shows them."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as fresh:
        for _ in range(calls):
            message = await call_tool(fresh, gateway.url, tool)
            assert "result" in message, message

    async def pids() -> set[str]:
        return set(ANSWERED.findall(gateway.log_text()[since:]))

    return await poll_until(pids, lambda found: len(found) >= gateway.workers, within=10)


async def test_with_workers_sighup_and_taskgate_reload_apply_in_every_worker(
    tmp_path: Path, r1: BackendProcess
) -> None:
    async with taskgate(tmp_path, document([r1], ["echo"]), workers=2) as gateway:
        since = len(gateway.log_text())
        gateway.write(document([r1], ["echo", "whoami"]))
        gateway.hangup()  # to the supervisor, which forwards it
        reloaded = await gateway.reloads(2, since)
        workers = {pid for pid, _ in reloaded}
        assert len(workers) == 2
        assert {trigger for _, trigger in reloaded} == {"SIGHUP"}
        since = len(gateway.log_text())
        assert await answered_by(gateway, "whoami", since) == workers

        since = len(gateway.log_text())
        gateway.write(document([r1], ["echo", "whoami", "stats"]))
        code, output = await taskgate_reload(gateway.config)
        assert code == 0, output
        assert "the other workers were asked to reload the same file" in output
        reloaded = await gateway.reloads(2, since)
        assert {pid for pid, _ in reloaded} == workers
        assert sorted(trigger for _, trigger in reloaded) == ["SIGHUP", "admin"]
        since = len(gateway.log_text())
        assert await answered_by(gateway, "stats", since) == workers
        assert gateway.running()


# -- in process: what a reload leaves alone ---------------------------------------------------


@asynccontextmanager
async def reloadable(
    tmp_path: Path, content: dict[str, Any]
) -> AsyncIterator[tuple[Running, Path]]:
    """taskgate in this process, started from a file (so that it can reload it)."""
    path = tmp_path / "taskgate.yaml"
    write(path, content)
    source = Source(str(path), path.read_bytes())
    async with running(load_config(path), source=source, drain_timeout_s=0) as process:
        yield process, path


def write(path: Path, content: dict[str, Any]) -> None:
    fixed = {"listen": {"host": "127.0.0.1", "port": 0}, "store": {"url": "sqlite:///:memory:"}}
    path.write_text(yaml.safe_dump({**fixed, **content}))


async def test_a_task_whose_owner_a_reload_removed_is_retryable_until_the_owner_is_back(
    http: aiohttp.ClientSession, tmp_path: Path, r1: BackendProcess, r2: BackendProcess
) -> None:
    async with reloadable(tmp_path, document([r1], ["generate_report"])) as (process, path):
        assert process.reloader is not None
        task_id = (await create_report(http, process.url, "s"))["taskId"]
        write(path, document([r2], ["generate_report"]))  # r1, its owner, leaves
        removed = await process.reloader.reload("SIGHUP")
        assert removed.applied, removed.problems
        assert f"backend reports: replica 127.0.0.1:{r1.port} removed" in removed.changes
        for _ in range(2):  # from the store, then from the route cache: never "not found"
            request_id = next_id()
            get = build_request("tasks/get", {"taskId": task_id}, id=request_id)
            assert_retryable(await post_raw(http, process.url, get), request_id)
        write(path, document([r1, r2], ["generate_report"]))  # r1 is back
        assert (await process.reloader.reload("SIGHUP")).applied
        assert (await get_task(http, process.url, task_id))["taskId"] == task_id
        # The same through a backend removed whole, then back.
        write(
            path,
            {
                "backends": {"other": {"replicas": [r2.url]}},
                "routes": [{"tools": ["echo"], "backend": "other"}],
            },
        )
        assert (await process.reloader.reload("admin")).applied
        request_id = next_id()
        get = build_request("tasks/get", {"taskId": task_id}, id=request_id)
        assert_retryable(await post_raw(http, process.url, get), request_id)
        write(path, document([r1], ["generate_report"]))
        assert (await process.reloader.reload("admin")).applied
        assert (await get_task(http, process.url, task_id))["taskId"] == task_id
        history = process.state.history
        assert [entry.applied for entry in history.reloads] == [True] * 4
        assert history.version == history.reloads[-1].version


async def test_a_call_in_flight_across_a_reload_completes_and_the_reload_does_not_wait_for_it(
    http: aiohttp.ClientSession, tmp_path: Path, r1: BackendProcess, r2: BackendProcess
) -> None:
    async with reloadable(tmp_path, document([r1], ["slow_count", "echo"])) as (process, path):
        assert process.reloader is not None
        state = process.state
        params = {"name": "slow_count", "arguments": {"n": 6, "delay_ms": 150}}
        call = asyncio.create_task(
            post_raw(http, process.url, build_request("tools/call", params, id=next_id()))
        )

        async def in_flight() -> int:
            return state.coordinator.in_flight

        await poll_until(in_flight, lambda n: n == 1, within=10)
        old_catalog, old_backends = state.catalog, state.backends
        write(
            path,
            {
                "backends": {"other": {"replicas": [r2.url]}},
                "routes": [{"tools": ["echo"], "backend": "other"}],
            },
        )
        entry = await process.reloader.reload("SIGHUP")
        assert entry.applied, entry.problems
        assert not call.done()  # the reload swapped, it did not wait for the call
        assert state.catalog is not old_catalog
        assert state.backends is not old_backends
        answer = await call
        assert answer.status == 200
        assert answer.message["result"]["structuredContent"] == {"result": 6}
        assert (await call_tool(http, process.url, "slow_count"))["error"]["code"] == -32602
        echo = await call_tool(http, process.url, "echo", {"text": "r2"})
        assert echo["result"]["structuredContent"] == {"result": "r2"}


async def test_two_reloads_at_once_run_one_after_the_other(
    tmp_path: Path, r1: BackendProcess
) -> None:
    async with reloadable(tmp_path, document([r1], ["echo"])) as (process, path):
        assert process.reloader is not None
        state = process.state
        health = state.health
        write(path, document([r1], ["echo", "whoami"]))
        first, second = await asyncio.gather(
            process.reloader.reload("SIGHUP"), process.reloader.reload("admin")
        )
        assert first.applied
        assert second.applied
        assert first.changes == ("routes changed (1 -> 1)",)
        assert second.changes == (
            "no change to the configuration (credentials and keys read again)",
        )
        assert state.health is health  # replica health is kept, not rebuilt
        assert len(state.history.reloads) == 2


async def test_post_reload_answers_409_when_taskgate_was_not_started_from_a_file(
    http: aiohttp.ClientSession, r1: BackendProcess
) -> None:
    config = gateway_config(
        {"reports": [r1.url]}, [(["echo"], "reports")], admin={"host": "127.0.0.1", "port": 0}
    )
    async with serving(config) as gateway:
        assert gateway.admin_url is not None
        status, body = await post_reload(http, gateway.admin_url)
        assert status == 409
        assert body["applied"] is False
        assert "not started from a configuration file" in body["problems"][0]


def test_what_the_running_process_was_built_with_is_refused_key_by_key(
    r1: BackendProcess,
) -> None:
    def config(**sections: Any) -> Any:
        return gateway_config({"reports": [r1.url]}, [(["echo"], "reports")], **sections)

    running_now = config(admin={"port": 9090})
    edited = config(
        listen={"port": 8081, "max_body_bytes": 2048, "strict_headers": True},
        admin={"port": 9091},
        store="redis://:secret@127.0.0.1:6379/0",
        logging={"format": "json"},
        auth={"task_sharing": "tenant"},
        health={"interval_s": 1},
    )
    problems = needs_restart(running_now, edited)
    assert [problem.split(":")[0] for problem in problems] == [
        "listen.port",
        "listen.max_body_bytes",
        "admin.port",
        "store.url",
        "logging.format",
    ]
    assert (
        problems[0] == "listen.port: 0 -> 8081: the listener's address changes only with a restart"
    )
    assert "secret" not in " ".join(problems)  # a store URL's password is not repeated
