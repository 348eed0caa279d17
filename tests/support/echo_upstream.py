"""A raw aiohttp MCP upstream that shows tests what taskgate sent it, and misbehaves on request.

The report backend (FastMCP) is the real server for behaviour; this one exists for what FastMCP
cannot show: the exact headers and bytes that arrive upstream, and broken answers.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

SEEN = web.AppKey("seen", list)
RELEASE = web.AppKey("release", asyncio.Event)

TOOLS = [
    {"name": "headers", "inputSchema": {"type": "object"}},
    {"name": "sse_bytes", "inputSchema": {"type": "object"}},
    {"name": "html_503", "inputSchema": {"type": "object"}},
    {"name": "hang", "inputSchema": {"type": "object"}},
]
# An SSE answer with CRLF line ends, a comment, a keep-alive and odd spacing: relayed verbatim.
SSE_BODY = (
    b": keep-alive\r\n\r\n"
    b'event: message\r\ndata: {"jsonrpc":"2.0","method":"notifications/progress",'
    b'"params":{"progressToken":"p","progress":1}}\r\n\r\n'
    b'data:{"jsonrpc":"2.0","id":%s,"result":{"resultType":"complete","content":[]}}\r\n\r\n'
)


def make_echo_app() -> web.Application:
    app = web.Application()
    app[SEEN] = []
    app[RELEASE] = asyncio.Event()
    app.router.add_post("/mcp", _handle)
    return app


async def _handle(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    message = orjson.loads(body)
    request.app[SEEN].append({"headers": list(request.headers.items()), "body": body})
    method, request_id = message["method"], message.get("id")
    raw_id = orjson.dumps(request_id)
    if method == "server/discover":
        return _result(
            raw_id,
            {
                "resultType": "complete",
                "supportedVersions": ["2026-07-28"],
                "capabilities": {"tools": {}},
                "ttlMs": 0,
                "cacheScope": "public",
            },
        )
    if method == "tools/list":
        return _result(raw_id, {"resultType": "complete", "tools": TOOLS})
    name = message["params"]["name"]
    if name == "headers":
        seen = {"headers": [[k, v] for k, v in request.headers.items()]}
        return _result(raw_id, {"resultType": "complete", "content": [], "structuredContent": seen})
    if name == "sse_bytes":
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(SSE_BODY % raw_id)
        await response.write_eof()
        return response
    if name == "html_503":
        return web.Response(status=503, text="<html>busy</html>", content_type="text/html")
    # "hang": answer only when the test releases it (or never, to test disconnects).
    await request.app[RELEASE].wait()
    return _result(raw_id, {"resultType": "complete", "content": []})


def _result(raw_id: bytes, result: dict[str, Any]) -> web.Response:
    body = b'{"jsonrpc":"2.0","id":' + raw_id + b',"result":' + orjson.dumps(result) + b"}"
    return web.Response(body=body, content_type="application/json")
