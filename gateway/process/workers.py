"""`taskgate run`: one process, or N worker processes sharing the listener (SO_REUSEPORT).

Each worker is a whole taskgate with its own event loop (uvloop when installed), upstream pool,
coordinator and caches; they share only the durable task-route store. The parent starts them,
forwards SIGTERM/SIGINT, and exits when they have drained. A worker that dies on its own takes
the others down with it, so that the supervisor (systemd, Kubernetes) restarts a whole instance.

Reloads (gateway/ops/reload.py): SIGHUP to the parent is forwarded to every worker, each of which
reloads the file itself. Worker 0, which alone has the admin listener, applies a POST /reload
itself and then sends the parent SIGUSR1, which the parent forwards as SIGHUP to the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from multiprocessing.connection import wait
from types import FrameType

from gateway.config import Config
from gateway.errors import StartupError
from gateway.observe.board import announce, enlist
from gateway.observe.logs import configure as configure_logs
from gateway.ops.reload import RELOAD_OTHERS, SUPERVISOR_ENV
from gateway.process.serve import Source, run

log = logging.getLogger("taskgate")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's loop when it is installed (it is a dependency on Linux), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run_taskgate(config: Config, *, workers: int, log_level: str, path: str) -> int:
    _configure_logs(config, log_level)
    source = _source(path)
    if workers <= 1:
        return _serve_here(config, source, admin=True, reuse_port=False)
    if config.listen.port == 0:
        print("taskgate: --workers needs a fixed listen.port", file=sys.stderr)
        return 1
    return _supervise(config, source, workers, log_level)


def _configure_logs(config: Config, log_level: str) -> None:
    settings = config.logging
    configure_logs(
        log_level,
        json=settings.format == "json",
        max_pending_bytes=settings.max_pending_bytes,
        flush_timeout_s=settings.flush_timeout_s,
    )


def _source(path: str) -> Source:
    """The file as it was validated: its bytes are the running configuration's version."""
    with open(path, "rb") as file:
        return Source(os.path.abspath(path), file.read())


def _serve_here(config: Config, source: Source, *, admin: bool, reuse_port: bool) -> int:
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(run(config, source=source, admin=admin, reuse_port=reuse_port))
    except StartupError as refused:
        print(f"taskgate: cannot start: {refused}", file=sys.stderr)
        return 1
    except OSError as unusable:
        where = f"{config.listen.host}:{config.listen.port}"
        print(f"taskgate: cannot listen on {where}: {unusable}", file=sys.stderr)
        return 1
    return 0


def _worker(config: Config, source: Source, index: int, log_level: str) -> None:
    _die_with_parent()
    # How worker 0's reloader finds the parent that forwards its reloads to the others.
    os.environ[SUPERVISOR_ENV] = str(os.getppid())
    enlist(index)  # which worker this is, for the numbers it publishes (observe/board.py)
    _configure_logs(config, log_level)
    # Only the first worker answers the admin endpoints; every worker serves MCP traffic.
    sys.exit(_serve_here(config, source, admin=index == 0, reuse_port=True))


def _supervise(config: Config, source: Source, workers: int, log_level: str) -> int:
    context = multiprocessing.get_context("spawn")
    # Where each worker publishes its readiness and metrics for worker 0's admin listener.
    board = tempfile.TemporaryDirectory(prefix="taskgate-workers-")
    announce(board.name, workers)
    family = _Family(
        [
            context.Process(
                target=_worker, args=(config, source, i, log_level), name=f"taskgate-{i}"
            )
            for i in range(workers)
        ]
    )
    previous = {sig: signal.signal(sig, family.forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    previous[RELOAD_OTHERS] = signal.signal(RELOAD_OTHERS, family.others)
    # Ignored while the workers start: they inherit "ignored" through exec and keep it until
    # their loop handles SIGHUP, so that a SIGHUP then cannot kill a worker still starting
    # (it is lost for the instance: send it again once taskgate is listening).
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        for child in family.children:
            child.start()
        signal.signal(signal.SIGHUP, family.hangup)
        log.info("started %d workers", workers)
        return family.watch()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        board.cleanup()


class _Family:
    """The parent's workers, and whether the instance is stopping (a signal asked, or a worker
    exited on its own): stopping, the parent forwards no more reloads."""

    def __init__(self, children: list[multiprocessing.process.BaseProcess]) -> None:
        self.children = children
        self.stopping = False

    def forward(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        for child in self.children:
            if child.is_alive() and child.pid is not None:
                _signal(child.pid)

    def hangup(self, signum: int, frame: FrameType | None) -> None:
        self._reload(list(self.children))

    def others(self, signum: int, frame: FrameType | None) -> None:
        self._reload(list(self.children[1:]))  # worker 0 asked: it has reloaded already

    def _reload(self, targets: list[multiprocessing.process.BaseProcess]) -> None:
        if self.stopping:
            return
        for child in targets:
            if child.is_alive() and child.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGHUP)

    def watch(self) -> int:
        """Wait for every worker to exit; the first that exits on its own stops the others.
        1 if any exited with a failure."""
        running = list(self.children)
        while running:
            wait([child.sentinel for child in running])
            for child in [c for c in running if not c.is_alive()]:
                running.remove(child)
                if not self.stopping:
                    log.error(
                        "worker %s exited with %s; stopping the others", child.name, child.exitcode
                    )
                    self.stopping = True
                    for other in running:
                        if other.pid is not None:
                            _signal(other.pid)
        failed = [child for child in self.children if child.exitcode != 0]
        return 1 if failed else 0


def _die_with_parent() -> None:
    """Ask Linux to send this worker SIGTERM when the supervisor dies, even by SIGKILL, so that
    no worker outlives its instance holding the port."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:  # the supervisor died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _signal(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
