"""Chaos helpers: `taskgate run` as a subprocess killed by pid, and a ledger of task creations.

The chaos suite starts real processes and breaks them on purpose: a replica, a gateway and
Redis are SIGKILLed and brought back while tasks are being created. What these helpers keep
is what a client could observe: for every creation, either the task id it was handed or the
error it got instead, with the times it was sent and answered.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import yaml

from tests.support.mcp import Answer, JsonObject, build_request, post_raw
from tests.support.procs import LOOPBACK, REPO_ROOT, ProcessStartError

T = TypeVar("T")

# Every tool of the report backend, routed to it.
REPORT_TOOLS = ["generate_report", "report_*", "echo", "whoami", "slow_count", "stats"]
LISTENING = "listening on"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
POLL_INTERVAL = 0.05
UNIFORM_NOT_FOUND = {"code": -32602, "message": "Task not found"}


def write_gateway_config(
    path: Path,
    *,
    port: int,
    store_url: str,
    replicas: list[str],
    auth: Mapping[str, Any],
) -> Path:
    """The YAML of one `taskgate run`: a Redis store, JWT auth, every report tool routed."""
    config = {
        "listen": {"host": LOOPBACK, "port": port},
        "store": {"url": store_url, "timeout_s": 1},
        "tasks": {"record_timeout_s": 2},
        "auth": dict(auth),
        "backends": {"reports": {"replicas": replicas, "timeout_s": 15, "task_timeout_s": 5}},
        "routes": [{"tools": REPORT_TOOLS, "backend": "reports"}],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class TaskgateProcess:
    """`python -m gateway run --config FILE` on a fixed loopback port; restartable by pid.

    Its output goes to a log file (a pipe nobody reads could fill up and stall it); readiness
    is the "listening on" line appearing in that file after the current launch.
    """

    def __init__(self, name: str, config: Path, port: int, *, args: tuple[str, ...] = ()) -> None:
        self.name = name
        self.config = config
        self.port = port
        self.args = args  # more of `taskgate run`'s options, e.g. ("--workers", "2")
        self.log_path = config.parent / f"taskgate-{name}.log"
        self.launches = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._offset = 0

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/mcp"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"taskgate {self.name} is not running")
        return self._proc.pid

    def launch(self) -> None:
        """Spawn without waiting; the log of this launch starts where the last one ended."""
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError(f"taskgate {self.name} is already running")
        self._reap()
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "run", "--config", str(self.config), *self.args],
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.launches += 1

    async def wait_listening(self, within: float = START_TIMEOUT) -> None:
        """Poll this launch's log for the ready line; raise with the log if it exits or stalls."""
        proc = self._proc
        if proc is None:
            raise RuntimeError(f"taskgate {self.name} was never launched")
        async with asyncio.timeout(within):
            while LISTENING not in self.log_text(since_launch=True):
                if proc.poll() is not None:
                    raise ProcessStartError(self._failure(f"exited with {proc.returncode}"))
                await asyncio.sleep(POLL_INTERVAL)

    async def start(self, within: float = START_TIMEOUT) -> None:
        self.launch()
        try:
            await self.wait_listening(within)
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL at once, as a crash would; reaps the child."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGKILL)
        self._reap()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; idempotent."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._reap()

    def terminate(self) -> None:
        """SIGTERM without waiting: the process drains while the test goes on."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)

    async def exited(self, within: float = STOP_TIMEOUT) -> int:
        """Wait for the process to end by itself (after terminate()); its exit status."""
        proc = self._proc
        if proc is None:
            raise RuntimeError(f"taskgate {self.name} was never launched")
        code = await asyncio.to_thread(proc.wait, within)
        self._reap()
        return code

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_text(self, *, since_launch: bool = False) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._offset if since_launch else 0)
                return log.read().decode(errors="replace")
        except OSError as exc:
            return f"<log unavailable: {exc}>"

    def _reap(self) -> None:
        if self._proc is not None:
            self._proc.wait()
            self._proc = None

    def _failure(self, what: str) -> str:
        return f"taskgate {self.name} {what}; output:\n{self.log_text(since_launch=True)}"


@dataclass(frozen=True)
class Caller:
    """One principal with its bearer token."""

    tenant: str
    subject: str
    token: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@dataclass
class Creation:
    """One `generate_report` call as its client saw it: a task id, or an error instead."""

    index: int
    caller: Caller
    gateway: str
    size: str
    sent_at: float
    received_at: float = 0.0
    task_id: str | None = None
    error: str | None = None
    # An answer outside the contract (neither a task nor a 5xx / broken connection).
    unexpected: str | None = None


def classify_create(creation: Creation, answer: Answer, request_id: int) -> None:
    """Fill in `creation` from the HTTP answer to its tools/call."""
    try:
        message = answer.message
    except ValueError:
        message = None
    if not isinstance(message, dict) or message.get("id") != request_id:
        creation.unexpected = f"HTTP {answer.status}: {answer.raw[:300]!r}"
        return
    result = message.get("result")
    if answer.status == 200 and isinstance(result, dict) and result.get("resultType") == "task":
        task_id = result.get("taskId")
        if isinstance(task_id, str) and result.get("status") == "working":
            creation.task_id = task_id
            return
    error = message.get("error")
    if answer.status >= 500 and isinstance(error, dict) and error.get("code") == -32603:
        if answer.status == 503 and not _is_retryable(answer, error):
            creation.unexpected = f"a 503 outside the documented shape: {answer.raw[:300]!r}"
            return
        creation.error = f"HTTP {answer.status}: {error.get('message')}"
        return
    creation.unexpected = f"HTTP {answer.status}: {answer.raw[:300]!r}"


def _is_retryable(answer: Answer, error: JsonObject) -> bool:
    """The documented "try again": 503, Retry-After, -32603 with data {"retryable": true}."""
    retry_after = answer.headers.get("Retry-After", "")
    return retry_after.isdigit() and error.get("data") == {"retryable": True}


async def post_as(
    http: aiohttp.ClientSession,
    url: str,
    caller: Caller,
    method: str,
    params: Mapping[str, Any],
    *,
    id: int,
) -> Answer:
    """One JSON-RPC request (tasks extension declared) with the caller's bearer token."""
    return await post_raw(http, url, build_request(method, params, id=id), headers=caller.auth)


@dataclass
class Weather:
    """Whether a fault is in progress: a client that got an error waits for calm, so each
    fault costs a bounded number of failed creations instead of a burst of fast failures."""

    calm: asyncio.Event = field(default_factory=asyncio.Event)
    faults: dict[str, tuple[float, float]] = field(default_factory=dict)
    # Blocking restarts run in threads; they are awaited in `finally`, even after a failure.
    _threads: set[asyncio.Future[Any]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.calm.set()

    def begin(self) -> float:
        self.calm.clear()
        return time.monotonic()

    def end(self, name: str, began: float) -> float:
        ended = time.monotonic()
        self.faults[name] = (began, ended)
        self.calm.set()
        return ended

    async def in_thread(self, fn: Callable[[], T]) -> T:
        future = asyncio.get_running_loop().run_in_executor(None, fn)
        self._threads.add(future)
        try:
            return await asyncio.shield(future)
        finally:
            if future.done():
                self._threads.discard(future)

    async def settle(self, within: float = 60.0) -> None:
        """Wait for restarts still running in threads, so cleanup does not race them."""
        if self._threads:
            await asyncio.wait(self._threads, timeout=within)


@dataclass
class Progress:
    """How many creations have an outcome; events for the counts the chaos driver awaits."""

    finished: int = 0
    _marks: dict[int, asyncio.Event] = field(default_factory=dict)

    def mark(self, count: int) -> asyncio.Event:
        event = self._marks.setdefault(count, asyncio.Event())
        if self.finished >= count:
            event.set()
        return event

    def tick(self) -> None:
        self.finished += 1
        for count, event in self._marks.items():
            if self.finished >= count:
                event.set()


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports the OS just handed out (all bound at once)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
