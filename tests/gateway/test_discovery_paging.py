"""Discovery reads every page of a backend's list: an empty nextCursor is a cursor, not the end
(the 2026-07-28 core, server/utilities/pagination)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.gateway import gateway_config, serving
from tests.support.mcp import mcp_post, result_of

# cursor -> (tools on that page, nextCursor or None when the list ends)
PAGES: dict[str | None, tuple[list[str], str | None]] = {
    None: (["first"], ""),
    "": (["second"], "third-page"),
    "third-page": (["third"], None),
}


async def paged(request: web.Request) -> web.Response:
    message = await request.json()
    params = message.get("params") or {}
    result: dict[str, Any] = {"resultType": "complete"}
    if message["method"] == "server/discover":
        result |= {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}
    elif message["method"] == "tools/list":
        names, next_cursor = PAGES[params.get("cursor")]
        result["tools"] = [{"name": name, "inputSchema": {"type": "object"}} for name in names]
        if next_cursor is not None:
            result["nextCursor"] = next_cursor
    body = {"jsonrpc": "2.0", "id": message["id"], "result": result}
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def test_every_page_is_read_and_an_empty_cursor_is_not_the_end(
    http: aiohttp.ClientSession,
) -> None:
    app = web.Application()
    app.router.add_post("/mcp", paged)
    upstream = TestServer(app, host="127.0.0.1")
    await upstream.start_server()
    try:
        config = gateway_config({"paged": [str(upstream.make_url("/mcp"))]}, [(["*"], "paged")])
        async with serving(config) as gateway:
            status, response = await mcp_post(http, gateway.url, "tools/list", {}, id=1)
            assert status == 200
            names = [tool["name"] for tool in result_of(response)["tools"]]
            assert sorted(names) == ["first", "second", "third"]
    finally:
        await upstream.close()
