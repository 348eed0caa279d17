"""Run an application on a listener until SIGINT or SIGTERM, then shut it down cleanly."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

from aiohttp import web


async def serve(
    app: web.Application,
    host: str,
    port: int,
    *,
    on_ready: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve until SIGINT or SIGTERM; a client's disconnect cancels its handler (and upstream)."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await web.TCPSite(runner, host, port, reuse_address=True).start()
        if on_ready is not None:
            await on_ready()
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
