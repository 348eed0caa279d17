"""Processes a benchmark starts on loopback and stops by pid."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.procs import free_ports as free_ports  # re-exported for bench modules

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 60.0


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not): what a run checks it left nothing behind with."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def free_port() -> int:
    (port,) = free_ports(1)
    return port


def wait_port(port: int, proc: subprocess.Popen[bytes], within: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listened on {port} within {within:g} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def started(argv: list[str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` until the block ends; it is ready once `port` accepts connections."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 - it outlives this statement, closed below
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        wait_port(port, proc)
        yield proc
    except RuntimeError:
        log.seek(0)
        sys.stderr.write(log.read().decode(errors="replace")[-4000:])
        raise
    finally:
        stop(proc)
        log.close()


def backend(
    port: int, name: str = "b1"
) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    argv = [sys.executable, "-m", "backends.report", "--port", str(port), "--replica", name]
    return started(argv, port)


def instant_backend(port: int) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    return started([sys.executable, "-m", "bench.instant_backend", "--port", str(port)], port)


def redis(port: int, directory: Path) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory)]
    argv += ["--save", "", "--appendonly", "no"]
    return started(argv, port)


def taskgate(config: Path, port: int) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    argv = [
        sys.executable,
        "-m",
        "gateway",
        "run",
        "--config",
        str(config),
        "--log-level",
        "warning",
    ]
    return started(argv, port)
