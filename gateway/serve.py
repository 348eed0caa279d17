"""Run taskgate's listeners until SIGINT or SIGTERM, then drain and shut down cleanly."""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import Awaitable, Callable

from aiohttp import web


async def serve(
    server: web.Server,
    host: str,
    port: int,
    *,
    admin: tuple[web.Application, str, int] | None = None,
    reuse_port: bool = False,
    drain_timeout_s: float = 30.0,
    on_ready: Callable[[], Awaitable[None]] | None = None,
    on_stop: Callable[[], None] | None = None,
) -> None:
    """Serve until SIGINT or SIGTERM. Then `on_stop` (readiness turns false, new requests are
    refused), the listener closes, and in-flight requests get `drain_timeout_s` to finish."""
    runner = web.ServerRunner(server, shutdown_timeout=drain_timeout_s)
    admin_runner = web.AppRunner(admin[0], access_log=None) if admin else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await runner.setup()
        await web.TCPSite(runner, host, port, reuse_address=True, reuse_port=reuse_port).start()
        if admin is not None and admin_runner is not None:
            await admin_runner.setup()
            await web.TCPSite(admin_runner, admin[1], admin[2], reuse_address=True).start()
        # Everything built at start (modules, configuration, keys, the state) lives as long as
        # the process: out of the collector's sight, full collections stay short. Measured:
        # p99 at 64 connections 37 ms -> 17 ms (docs/performance.md).
        gc.freeze()
        if on_ready is not None:
            await on_ready()
        await stop.wait()
        if on_stop is not None:
            on_stop()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
        if admin_runner is not None:
            await admin_runner.cleanup()
