"""GET /metrics. Being built (issue 14)."""

from __future__ import annotations

from aiohttp import web


async def metrics(request: web.Request) -> web.Response:
    raise web.HTTPNotImplemented(text="metrics are being built (issue 14)\n")
