"""The command line as a user runs it: `taskgate run`, and `taskgate demo` stopped with Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.support.mcp import mcp_post, poll_until, result_of
from tests.support.procs import BackendProcess, free_ports

ROOT = Path(__file__).resolve().parents[2]
POLL_INTERVAL = 0.05
PORT_ATTEMPTS = 3  # free ports picked in turn when another process took the one picked


@contextlib.contextmanager
def taskgate(*args: str, cwd: Path = ROOT) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


def read_until(proc: subprocess.Popen[str], marker: str, within: float = 60) -> str:
    """Lines of output up to the one containing `marker` (the process prints as it goes)."""
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if marker in line:
            return "".join(seen)
    raise AssertionError(f"{marker!r} never appeared; output was:\n{''.join(seen)}")


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def test_run_serves_the_configured_backends(
    tmp_path: Path, report_backends: list[BackendProcess]
) -> None:
    (port,) = free_ports(1)
    replicas = ", ".join(f'"{b.url}"' for b in report_backends)
    config = tmp_path / "taskgate.yaml"
    config.write_text(
        f"listen: {{host: 127.0.0.1, port: {port}}}\n"
        f"store: {{url: 'sqlite:///{tmp_path}/routes.db'}}\n"
        f"backends:\n  reports: {{replicas: [{replicas}]}}\n"
        "routes:\n  - {tools: [whoami], backend: reports}\n"
    )
    with taskgate("run", "--config", str(config)) as proc:
        read_until(proc, "listening on")
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{port}/mcp"
            _, response = await mcp_post(
                http, url, "tools/call", {"name": "whoami", "arguments": {}}, id=1
            )
        assert result_of(response)["structuredContent"]["replica"] in ("r1", "r2")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_run_refuses_a_broken_config_naming_the_yaml_path(tmp_path: Path) -> None:
    config = tmp_path / "broken.yaml"
    config.write_text(
        "backends:\n  reports: {replicas: ['http://127.0.0.1:1/mcp']}\n"
        "routes:\n  - {tools: [a], backend: reports}\n  - {tools: [b], backend: reprots}\n"
    )
    with taskgate("run", "--config", str(config)) as proc:
        assert proc.wait(timeout=30) == 1
        assert proc.stdout is not None
        assert "routes[1].backend: unknown backend 'reprots'" in proc.stdout.read()


@pytest.mark.timeout(180)
async def test_the_demo_serves_two_replicas_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    port, first, second = free_ports(3)
    ports = ("--port", str(port), "--backend-ports", f"{first},{second}")
    # Run from elsewhere: the demo keeps its routes beside config/demo.yaml, whatever the cwd.
    with taskgate("demo", *ports, cwd=tmp_path) as proc:
        shown = read_until(proc, "Press Ctrl-C", within=120)
        assert f"http://127.0.0.1:{port}/mcp" in shown
        assert '{"replica":"r1"}' in shown
        assert '{"replica":"r2"}' in shown
        assert "input_required" in shown
        assert 'completed: {"size":"small","approved":true,"replica":' in shown
        assert "Status page: http://127.0.0.1:" in shown
        assert accepts(first)
        assert accepts(second)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    # The replicas were stopped with taskgate, not left behind.
    assert not accepts(first)
    assert not accepts(second)


@contextlib.contextmanager
def two_workers(
    tmp_path: Path, backends: list[BackendProcess]
) -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """`taskgate run --workers 2` on free ports, once both workers listen, each in its own
    words (a connection made while one of them is still starting, or failed to, would test the
    start, not the sharing); the process, its port and its admin port. A port free when picked
    can be taken by another process of the suite before taskgate binds it: then other ports, a
    few times."""
    replicas = ", ".join(f'"{b.url}"' for b in backends)
    for attempt in range(PORT_ATTEMPTS):
        port, admin = free_ports(2)
        config = tmp_path / "taskgate.yaml"
        config.write_text(
            f"listen: {{host: 127.0.0.1, port: {port}}}\n"
            f"admin: {{host: 127.0.0.1, port: {admin}}}\n"
            f"store: {{url: 'sqlite:///{tmp_path}/routes-{attempt}.db'}}\n"
            f"backends:\n  reports: {{replicas: [{replicas}]}}\n"
            "routes:\n  - {tools: ['*'], backend: reports}\n"
        )
        with taskgate("run", "--config", str(config), "--workers", "2") as proc:
            output = read_lines(proc, lambda seen: seen.count("listening on http://") == 2)
            if output.count("listening on http://") == 2:
                yield proc, port, admin
                return
            if "Address already in use" not in output or attempt == PORT_ATTEMPTS - 1:
                raise AssertionError(f"the two workers did not both listen; output was:\n{output}")


def read_lines(proc: subprocess.Popen[str], done: Callable[[str], bool], within: float = 60) -> str:
    """The process's output until `done` holds of all of it, or the output ends."""
    assert proc.stdout is not None
    seen = ""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not done(seen):
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    return seen


async def test_workers_share_the_listener_and_the_task_routes(
    tmp_path: Path, report_backends: list[BackendProcess]
) -> None:
    with two_workers(tmp_path, report_backends) as (proc, port, _):
        workers = await worker_pids(proc.pid, 2)
        url = f"http://127.0.0.1:{port}/mcp"
        async with aiohttp.ClientSession() as http:
            await poll_until(lambda: _listening(http, url), bool, within=30)
            params = {"name": "generate_report", "arguments": {"size": "s"}}
            for n in range(10):
                # A fresh connection each time, so the kernel spreads them over the workers.
                async with aiohttp.ClientSession() as fresh:
                    _, created = await mcp_post(fresh, url, "tools/call", params, id=n)
                task_id = result_of(created)["taskId"]
                async with aiohttp.ClientSession() as fresh:
                    _, got = await mcp_post(fresh, url, "tasks/get", {"taskId": task_id}, id=n)
                assert result_of(got)["taskId"] == task_id
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert not any(alive(pid) for pid in workers)


async def worker_pids(parent: int, count: int, within: float = 30) -> list[str]:
    """The `count` worker processes of `parent`, once each runs the worker program.

    multiprocessing also starts a resource tracker, and a worker that was forked but has not
    yet exec'd still shows the parent's command line: the children are read again until
    `count` of them show spawn_main, within `within` seconds.
    """
    found: list[str] = []
    try:
        async with asyncio.timeout(within):
            while True:
                found = spawned_children(parent)
                if len(found) >= count:
                    break
                await asyncio.sleep(POLL_INTERVAL)
    except TimeoutError:
        raise AssertionError(f"{count} workers never ran; spawn_main in {found}") from None
    assert len(found) == count, found
    return found


def spawned_children(parent: int) -> list[str]:
    """The children of `parent` whose command line is multiprocessing's spawn_main."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    spawned = []
    for pid in children:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:  # it exited between the two reads
            continue
        if b"spawn_main" in cmdline:
            spawned.append(pid)
    return spawned


def alive(pid: str) -> bool:
    return Path(f"/proc/{pid}").exists()


async def _listening(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.post(url, data=b"{}", headers={"Content-Type": "application/json"}):
            return True
    except aiohttp.ClientConnectionError:
        return False


def into_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """`taskgate ARGS | head` with the reader gone before taskgate writes: every write of its
    standard output fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "gateway", *args],
            cwd=ROOT,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)


def test_check_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`taskgate check | head`: the reader is gone before check writes; no traceback."""
    done = into_closed_pipe("check", "--config", "config/demo.yaml")
    assert done.returncode == 0
    assert "Traceback" not in done.stderr
    assert "BrokenPipeError" not in done.stderr


def test_check_warns_of_key_files_and_token_variables_run_would_miss(tmp_path: Path) -> None:
    config = tmp_path / "taskgate.yaml"
    config.write_text(
        "auth:\n"
        "  mode: jwt\n"
        "  issuer: https://issuer.example\n"
        "  audience: https://taskgate.example/mcp\n"
        "  algorithms: [ES256, HS256]\n"
        "  keys:\n"
        "    - {kid: a, alg: ES256, file: /nonexistent/key.pem}\n"
        "    - {kid: b, alg: HS256, secret_env: TASKGATE_TEST_UNSET_SECRET}\n"
        "backends:\n"
        "  reports:\n"
        "    replicas: ['http://127.0.0.1:9/mcp']\n"
        "    upstream_auth: {bearer_env: TASKGATE_TEST_UNSET_TOKEN}\n"
        "routes:\n  - {tools: [echo], backend: reports}\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TASKGATE_TEST_UNSET_SECRET", "TASKGATE_TEST_UNSET_TOKEN")
    }
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "check", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("taskgate: warning:")]
    assert warnings == [
        "taskgate: warning: auth.keys[0].file: /nonexistent/key.pem does not exist "
        "(run will not start)",
        "taskgate: warning: auth.keys[1].secret_env: $TASKGATE_TEST_UNSET_SECRET is not set "
        "here (run will not start)",
        "taskgate: warning: backends.reports.upstream_auth.bearer_env: "
        "$TASKGATE_TEST_UNSET_TOKEN is not set here (run will not start)",
    ]


DEMO = [sys.executable, "-m", "gateway", "demo"]


def test_the_demo_on_a_taken_port_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        backend_ports = ",".join(str(p) for p in free_ports(2))
        done = subprocess.run(
            [*DEMO, "--port", str(port), "--backend-ports", backend_ports],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert f"taskgate demo: cannot listen on 127.0.0.1:{port}: " in done.stderr
    assert "make demo PORT=N" in done.stderr
