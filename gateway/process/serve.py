"""One taskgate process: its state, the public listener and the admin listener, started and
stopped in order. `taskgate run` (and each of its workers), `taskgate demo` and the tests all
start taskgate here, so that what they run is the same wiring.

    async with running(config) as process:   # listening; process.url, process.state
        await until_stopped(process)         # SIGINT/SIGTERM: drain; SIGHUP: reload
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from gateway import __version__, build
from gateway.config import Config
from gateway.h1.server import Server
from gateway.observe.board import WorkerBoard
from gateway.observe.history import ConfigHistory, config_version
from gateway.ops.admin import make_admin_app
from gateway.ops.publish import publish_forever
from gateway.ops.reload import Reloader
from gateway.pipeline.listener import public_server
from gateway.pipeline.state import Gateway
from gateway.process.app import gateway_state

log = logging.getLogger("taskgate")


@dataclass(frozen=True, slots=True)
class Source:
    """The file a configuration was read from, and its bytes as read (its version)."""

    path: str
    text: bytes


@dataclass(slots=True)
class Running:
    config: Config  # as started; the state's config is the one running now (reload)
    state: Gateway
    server: Server  # the public listener's server (its connections, the bytes it holds)
    url: str  # the MCP endpoint, with the port actually bound
    admin_url: str | None
    reloader: Reloader | None  # None when the configuration was not read from a file
    drain_timeout_s: float

    def drain(self) -> None:
        """Readiness turns false, new requests are refused, listen streams end gracefully."""
        self.state.coordinator.draining = True
        self.state.listens.drain()
        if self.state.legacy is not None:
            self.state.legacy.streams.drain()


@contextlib.asynccontextmanager
async def running(
    config: Config,
    *,
    source: Source | None = None,
    admin: bool = True,
    reuse_port: bool = False,
    drain_timeout_s: float | None = None,
) -> AsyncIterator[Running]:
    """taskgate listening on `config.listen` (port 0: a free one) and, when `admin` and the
    configuration has one, on its admin listener. On leaving: the listener closes, listen
    streams end, in-flight requests get `drain_timeout_s` (default listen.drain_timeout_s),
    then the state closes in reverse order."""
    listen = config.listen
    history = ConfigHistory(
        config_version(source.text if source else config.model_dump_json().encode()),
        source.path if source else None,
    )
    drain_s = listen.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
    loop = asyncio.get_running_loop()
    async with gateway_state(config, history=history) as state:
        server = public_server(config, state)
        listener = await loop.create_server(
            server, listen.host, listen.port, reuse_address=True, reuse_port=reuse_port or None
        )
        admin_runner: web.AppRunner | None = None
        process: Running | None = None
        publisher: asyncio.Task[None] | None = None
        try:
            state.board = WorkerBoard.from_environment()
            if state.board is not None:
                publisher = loop.create_task(publish_forever(state.board, state))
            port = listener.sockets[0].getsockname()[1]
            reloader = Reloader(state, source.path) if source is not None else None
            admin_url = None
            if admin and config.admin is not None:
                admin_runner = web.AppRunner(make_admin_app(state, reloader), access_log=None)
                await admin_runner.setup()
                site = web.TCPSite(
                    admin_runner, config.admin.host, config.admin.port, reuse_address=True
                )
                await site.start()
                admin_port = admin_runner.addresses[0][1]
                admin_url = f"http://{_host(config.admin.host)}:{admin_port}"
            url = f"http://{_host(listen.host)}:{port}{listen.path}"
            process = Running(config, state, server, url, admin_url, reloader, drain_s)
            yield process
        finally:
            if publisher is not None:
                publisher.cancel()
            listener.close()  # no new connections; those open finish their answers
            if process is not None:
                process.drain()
            else:
                state.listens.drain()
                if state.legacy is not None:
                    state.legacy.streams.drain()
            # Requests and the tasks this process runs drain together, for the same time.
            await asyncio.gather(server.shutdown(drain_s), state.made.drain(drain_s))
            if admin_runner is not None:
                await admin_runner.cleanup()


async def until_stopped(
    process: Running, *, on_ready: Callable[[], Awaitable[None]] | None = None
) -> None:
    """Serve until SIGINT or SIGTERM, then drain (the listener closes as `running` ends).
    SIGHUP reloads the configuration file when there is one."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    reloads: set[asyncio.Task[object]] = set()

    def hangup() -> None:
        if process.reloader is None:
            log.warning("SIGHUP: this taskgate was not started from a file; nothing to reload")
            return
        task = loop.create_task(process.reloader.reload("SIGHUP"))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, hangup)
    try:
        # Everything built at start (modules, configuration, keys, the state) lives as long as
        # the process: out of the collector's sight, full collections stay short. Measured:
        # p99 at 64 connections 37 ms -> 17 ms (docs/performance.md).
        gc.freeze()
        if on_ready is not None:
            await on_ready()
        await stop.wait()
        log.info("stopping: draining in-flight requests for up to %g s", process.drain_timeout_s)
        process.drain()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        # While the drain runs, a SIGHUP (its default kills) is refused with a line, not obeyed.
        loop.add_signal_handler(
            signal.SIGHUP, log.warning, "SIGHUP while stopping: no reload, the drain goes on"
        )
        for task in list(reloads):
            task.cancel()


async def run(
    config: Config, *, source: Source | None = None, admin: bool = True, reuse_port: bool = False
) -> None:
    """`taskgate run` in one process (or one worker): serve until stopped."""
    async with running(config, source=source, admin=admin, reuse_port=reuse_port) as process:

        async def announce() -> None:
            log.info("listening on %s (taskgate %s, %s)", process.url, __version__, build())
            if process.admin_url is not None:
                log.info(
                    "admin on %s (status page /, /metrics, /healthz, /readyz)", process.admin_url
                )

        await until_stopped(process, on_ready=announce)


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
