"""The admin listener's status page (GET /). Being built (issue 14)."""

from __future__ import annotations

from aiohttp import web


async def status_page(request: web.Request) -> web.Response:
    raise web.HTTPNotImplemented(text="the status page is being built (issue 14)\n")
