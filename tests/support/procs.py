"""Real backend and redis-server processes for tests, on loopback, stopped by pid."""

from __future__ import annotations

import collections
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self
from urllib.parse import urlsplit

import redis

REPO_ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
READY_PREFIX = "READY "
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
POLL_INTERVAL = 0.05
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_BIND_ATTEMPTS = 5


class ProcessStartError(RuntimeError):
    """A helper process exited or stayed silent before it was ready."""


def _stop_popen(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM, wait up to `timeout`, then SIGKILL; reaps the child either way."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            pass
    _kill_popen(proc)


def _kill_popen(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL and reap, so no zombie or ResourceWarning is left behind."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _read_text(path: Path) -> str:
    """A log file's contents, or a note that it is gone."""
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        return f"<log unavailable: {exc}>"


def _read_line(stream: IO[bytes], deadline: float, pending: bytearray) -> str | None:
    """Read one line before `deadline` without blocking past it; None at EOF.

    Uses the raw fd with select so a silent child cannot hang the test run;
    `pending` carries bytes after the newline across calls.
    """
    fd = stream.fileno()
    while b"\n" not in pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no complete line before the deadline")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        pending.extend(chunk)
    line, _, rest = bytes(pending).partition(b"\n")
    pending[:] = rest
    return line.decode(errors="replace").strip()


class _Managed:
    """`with` starts the process unless it runs already, and cleans it up at the end."""

    _proc: subprocess.Popen[bytes] | None

    def start(self) -> Self:
        raise NotImplementedError

    def cleanup(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        if self._proc is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


class BackendProcess(_Managed):
    """One `python -m backends.report` replica on a port the OS picked."""

    def __init__(
        self,
        name: str,
        *,
        tasks_url: str = "memory://",
        extra_args: Sequence[str] = (),
        asking: bool = False,
    ) -> None:
        self.name = name
        self.tasks_url = tasks_url
        # --asking: the `ask` tool, and 2025-era sessions kept for its elicitation.
        self.asking = asking
        # Appended to the command line, e.g. ("--many", "25", "--page-size", "10").
        self.extra_args = tuple(extra_args)
        self._dir = Path(tempfile.mkdtemp(prefix=f"taskgate-backend-{name}-"))
        self.log_path = self._dir / "stderr.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._url: str | None = None
        # 0 until the first READY line; a restart reuses the announced port.
        self._port = 0

    @property
    def argv(self) -> list[str]:
        """The command line; port 0 first, so the backend announces the port it got."""
        argv = [sys.executable, "-m", "backends.report", "--replica", self.name]
        argv += ["--port", str(self._port), "--host", LOOPBACK, "--tasks-url", self.tasks_url]
        if self.asking:
            argv.append("--asking")
        return [*argv, *self.extra_args]

    @property
    def url(self) -> str:
        """The MCP endpoint, e.g. http://127.0.0.1:41234/mcp."""
        if self._url is None:
            raise RuntimeError(f"backend {self.name} is not ready")
        return self._url

    @property
    def pid(self) -> int:
        """The child's pid."""
        if self._proc is None:
            raise RuntimeError(f"backend {self.name} was never launched")
        return self._proc.pid

    @property
    def port(self) -> int:
        """The port announced by the first READY line."""
        if not self._port:
            raise RuntimeError(f"backend {self.name} is not ready")
        return self._port

    def launch(self) -> None:
        """Spawn the child without waiting, so several can boot in parallel."""
        if self._proc is not None:
            if self._proc.poll() is None:
                raise RuntimeError(f"backend {self.name} is already running")
            self.kill()  # reaps the previous run and closes its pipe
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.argv,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Read stdout until the READY line; on failure stop it and raise with its log."""
        proc = self._require_proc()
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        pending = bytearray()
        try:
            while self._url is None:
                line = _read_line(proc.stdout, deadline, pending)
                if line is None:
                    raise ProcessStartError(self._failure("exited before READY"))
                if line.startswith(READY_PREFIX):
                    self._url = line.removeprefix(READY_PREFIX).strip()
                    self._port = _port_of(self._url)
        except TimeoutError:
            self.stop()
            raise ProcessStartError(self._failure(f"not READY within {timeout}s")) from None
        except ProcessStartError:
            self.stop()
            raise
        # Nothing else is printed to stdout; closing our end frees the fd now.
        proc.stdout.close()

    def start(self, timeout: float = READY_TIMEOUT) -> Self:
        """Launch and wait until the READY line."""
        self.launch()
        self.wait_ready(timeout)
        return self

    def restart(self, timeout: float = READY_TIMEOUT) -> None:
        """Stop, then start again on the same port (its memory:// tasks are lost)."""
        self.stop()
        self.start(timeout)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; idempotent."""
        if self._proc is not None:
            _stop_popen(self._proc)
            self._close_stdout()
        self._url = None

    def kill(self) -> None:
        """SIGKILL at once, as a crash would."""
        if self._proc is not None:
            _kill_popen(self._proc)
            self._close_stdout()
        self._url = None

    def cleanup(self) -> None:
        """Stop the process and remove its log directory."""
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def log_text(self) -> str:
        """What the backend wrote to stderr so far."""
        return _read_text(self.log_path)

    @property
    def returncode(self) -> int | None:
        """The exit status once the child has been reaped, else None."""
        return None if self._proc is None else self._proc.poll()

    def _require_proc(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise RuntimeError(f"backend {self.name} was never launched")
        return self._proc

    def _close_stdout(self) -> None:
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()

    def _failure(self, what: str) -> str:
        return f"backend {self.name} {what}; stderr:\n{self.log_text()}"

    def __repr__(self) -> str:
        return f"BackendProcess(name={self.name!r}, url={self._url!r})"


class PushingBackendProcess(BackendProcess):
    """One `python -m backends.pushing` replica (the mcp SDK's MCPServer, which serves
    subscriptions/listen); the same READY line, restart and stop as BackendProcess."""

    def __init__(self, name: str) -> None:
        super().__init__(name)

    @property
    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "backends.pushing", "--replica", self.name]
        return [*argv, "--port", str(self._port), "--host", LOOPBACK]


class PlainBackendProcess(BackendProcess):
    """One `python -m backends.plain` replica: a FastMCP server without the Tasks extension,
    whose calls taskgate runs as tasks of its own; the same READY line, restart and stop."""

    def __init__(self, name: str) -> None:
        super().__init__(name)

    @property
    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "backends.plain", "--replica", self.name]
        return [*argv, "--port", str(self._port), "--host", LOOPBACK]


def _port_of(url: str) -> int:
    """The port of an announced URL."""
    port = urlsplit(url).port
    if port is None:
        raise ProcessStartError(f"READY line without a port: {url}")
    return port


def start_backends(
    names: Sequence[str],
    *,
    tasks_url: str = "memory://",
    timeout: float = READY_TIMEOUT,
    pushing: bool = False,
) -> list[BackendProcess]:
    """Launch all replicas at once, then wait for each; on failure stop them all. `pushing`:
    MCPServer replicas (backends/pushing.py) rather than report ones."""
    backends = [
        PushingBackendProcess(name) if pushing else BackendProcess(name, tasks_url=tasks_url)
        for name in names
    ]
    try:
        for backend in backends:
            backend.launch()
        for backend in backends:
            backend.wait_ready(timeout)
    except BaseException:
        stop_all(backends)
        raise
    return backends


def stop_all(processes: Iterable[BackendProcess | RedisProcess]) -> None:
    """Stop and clean up every process, even when one of them fails to stop."""
    errors: list[Exception] = []
    for process in processes:
        try:
            process.cleanup()
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise ExceptionGroup("stopping test processes failed", errors)


def pick_port(host: str = LOOPBACK) -> int:
    """A port the OS just handed out; redis must be told a number, not 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


# Ports for processes that must be told a number before they listen. Not the kernel's
# ephemeral range (bind to port 0, or any outgoing connection, takes from it): a port picked
# there can be taken by another test's client connection before the process binds it, which
# failed CI runs with "Address already in use". Below that range, each pytest-xdist worker
# picks from a slice of its own, so neither a connection nor another worker takes one.
_PORTS_FROM = 10_000
_SLICES = 16
_picks = random.Random()
# Handed out lately by this process: not handed out again before its process had time to bind
# it (the kernel's allocator, which this replaces, moves on the same way).
_recent: collections.deque[int] = collections.deque(maxlen=256)


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
            return int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _slice() -> range:
    """This worker's ports: its share of _PORTS_FROM up to the ephemeral range."""
    end = max(_ephemeral_start(), _PORTS_FROM + _SLICES * 64)
    size = (end - _PORTS_FROM) // _SLICES
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % _SLICES if worker.isdigit() else 0
    start = _PORTS_FROM + index * size
    return range(start, start + size)


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """`count` distinct ports free now on `host`, outside the ephemeral range and in this
    worker's slice of the ports below it (see _PORTS_FROM), for processes that need a number."""
    ports = _slice()
    found: list[int] = []
    for port in _picks.sample(ports, min(len(ports), 64 * count)):
        if port in _recent:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))  # without SO_REUSEADDR: a port in TIME_WAIT is skipped
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            _recent.extend(found)
            return found
    raise RuntimeError(f"no {count} free ports in {ports.start}-{ports.stop - 1} on {host}")


class RedisProcess(_Managed):
    """A throwaway redis-server on loopback with its own data directory: Debian's by default,
    or another compatible server binary (`server`, e.g. valkey-server)."""

    def __init__(
        self, *, aof: bool = False, extra_args: tuple[str, ...] = (), server: str = REDIS_SERVER
    ) -> None:
        self.aof = aof
        self.extra_args = extra_args
        self.server = server
        self.dir = Path(tempfile.mkdtemp(prefix="taskgate-redis-"))
        self.log_path = self.dir / "redis.log"
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        """The port redis listens on (kept across restarts)."""
        if self._port is None:
            raise RuntimeError("redis was never started")
        return self._port

    @property
    def url(self) -> str:
        """A redis URL for database 0."""
        return f"redis://{LOOPBACK}:{self.port}/0"

    @property
    def pid(self) -> int:
        """The redis-server pid."""
        if self._proc is None:
            raise RuntimeError("redis is not running")
        return self._proc.pid

    def argv(self, port: int) -> list[str]:
        """The redis-server command line for `port`."""
        # fsync every write so a SIGKILL in a durability test loses nothing acknowledged.
        aof = ["--appendonly", "yes", "--appendfsync", "always"] if self.aof else []
        return [
            *(self.server, "--port", str(port), "--bind", LOOPBACK, "--dir", str(self.dir)),
            *("--save", "", "--protected-mode", "yes"),
            *(aof or ["--appendonly", "no"]),
            *self.extra_args,
        ]

    def start(self, timeout: float = READY_TIMEOUT) -> Self:
        """Start on a fresh port, trying another if a racing process took it."""
        if self._proc is not None:
            raise RuntimeError("redis is already running")
        for _ in range(REDIS_BIND_ATTEMPTS):
            port = pick_port()
            if self._spawn_and_wait(port, timeout):
                self._port = port
                return self
        raise ProcessStartError(self._failure(f"did not start in {REDIS_BIND_ATTEMPTS} tries"))

    def restart(self, timeout: float = READY_TIMEOUT) -> None:
        """Stop, then start again on the same port and data directory."""
        port = self.port
        self.stop()
        deadline = time.monotonic() + timeout
        # The port is ours in practice, but a stray connect may briefly hold it.
        while not self._spawn_and_wait(port, max(deadline - time.monotonic(), POLL_INTERVAL)):
            if time.monotonic() >= deadline:
                raise ProcessStartError(self._failure(f"did not restart on port {port}"))
            time.sleep(POLL_INTERVAL)

    def stop(self) -> None:
        """SIGTERM (redis writes its AOF and exits), then SIGKILL; idempotent."""
        if self._proc is not None:
            _stop_popen(self._proc)
            self._proc = None

    def kill(self) -> None:
        """SIGKILL at once, as a crash would."""
        if self._proc is not None:
            _kill_popen(self._proc)
            self._proc = None

    def cleanup(self) -> None:
        """Stop the server and remove its data directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def client(self) -> redis.Redis:
        """A sync client; the caller closes it."""
        return redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=5)

    def scripts_run(self) -> int:
        """How many Lua scripts the server has run (EVALSHA and EVAL calls) since it started."""
        with self.client() as client:
            stats = client.info("commandstats")
        return sum(
            int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval")
        )

    def flushall(self) -> None:
        """Empty every database."""
        with self.client() as client:
            client.flushall()

    def log_text(self) -> str:
        """The redis-server log so far."""
        return _read_text(self.log_path)

    def _spawn_and_wait(self, port: int, timeout: float) -> bool:
        """Spawn on `port`; True once PING answers, False if it exited (port taken)."""
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(
                self.argv(port),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            ready = _wait_for_ping(proc, port, time.monotonic() + timeout)
        except BaseException:
            _kill_popen(proc)
            raise
        if ready:
            self._proc = proc
            return True
        _kill_popen(proc)
        return False

    def _failure(self, what: str) -> str:
        return f"redis-server {what}; log:\n{self.log_text()}"

    def __repr__(self) -> str:
        return f"RedisProcess(port={self._port!r}, aof={self.aof!r})"


def _wait_for_ping(proc: subprocess.Popen[bytes], port: int, deadline: float) -> bool:
    """Poll until our redis answers (True) or exits (False); raise at the deadline.

    Checks the answering pid too: if another process won the port, our server
    exits, and a PING alone could be answered by the other one.
    """
    with redis.Redis(
        host=LOOPBACK, port=port, socket_timeout=1, socket_connect_timeout=1
    ) as client:
        while proc.poll() is None:
            try:
                if client.info("server").get("process_id") == proc.pid:
                    return True
            except redis.ConnectionError:
                pass
            if time.monotonic() >= deadline:
                raise ProcessStartError(f"redis-server on port {port} did not answer PING")
            time.sleep(POLL_INTERVAL)
    return False
