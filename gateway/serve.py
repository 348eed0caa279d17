"""Run taskgate's listeners until SIGINT or SIGTERM, then drain and shut down cleanly."""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gateway.errors import error_body
from gateway.protocol.codes import Code


class _JSONErrorHandler(RequestHandler):
    """aiohttp answers what its HTTP parser refuses (header too long, too many headers, a
    broken request line) in plain text; taskgate's clients get a JSON-RPC error body too."""

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        response = super().handle_error(request, status, exc, message)
        if isinstance(response, web.Response):
            try:
                phrase = HTTPStatus(status).phrase
            except ValueError:
                phrase = f"HTTP {status}"
            reason = f"{phrase}: {type(exc).__name__}" if exc is not None else phrase
            code = Code.INTERNAL_ERROR if status >= 500 else Code.INVALID_REQUEST
            response.body = error_body(None, code, reason)
            response.content_type = "application/json"
        return response


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        return _JSONErrorHandler(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """An AppRunner whose connections answer parser errors with JSON-RPC bodies."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp builds its Server itself; only the per-connection handler class changes.
        server.__class__ = _Server
        return server


async def serve(
    app: web.Application,
    host: str,
    port: int,
    *,
    admin: tuple[web.Application, str, int] | None = None,
    reuse_port: bool = False,
    drain_timeout_s: float = 30.0,
    max_line_size: int = 8190,
    max_headers: int = 100,
    on_ready: Callable[[], Awaitable[None]] | None = None,
    on_stop: Callable[[], None] | None = None,
) -> None:
    """Serve until SIGINT or SIGTERM. Then `on_stop` (readiness turns false, new requests are
    refused), the listener closes, and in-flight requests get `drain_timeout_s` to finish."""
    runner = GatewayRunner(
        app,
        handler_cancellation=True,  # a client's disconnect cancels its handler, and upstream
        access_log=None,
        shutdown_timeout=drain_timeout_s,
        max_line_size=max_line_size,
        max_field_size=max_line_size,
        max_headers=max_headers,
    )
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
        # Everything built at start (modules, configuration, keys, the app) lives as long as
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
