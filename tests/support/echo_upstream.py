"""A raw aiohttp MCP upstream that shows tests what taskgate sent it, and misbehaves on request.

The report backend (FastMCP) is the real server for behaviour; this one exists for what FastMCP
cannot show: the exact headers and bytes that arrive upstream, and broken answers.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from typing import Any

import orjson
from aiohttp import web

SEEN = web.AppKey("seen", list)
RELEASE = web.AppKey("release", asyncio.Event)
# A held event stream sends its first event, then waits for this before it goes on.
HOLD = web.AppKey("hold", asyncio.Event)

TOOLS = [
    {"name": "headers", "inputSchema": {"type": "object"}},
    {"name": "sse_bytes", "inputSchema": {"type": "object"}},
    {"name": "html_503", "inputSchema": {"type": "object"}},
    {"name": "gzip", "inputSchema": {"type": "object"}},
    {"name": "hang", "inputSchema": {"type": "object"}},
    {"name": "make_task", "inputSchema": {"type": "object"}},
    {"name": "make_task_sse", "inputSchema": {"type": "object"}},
    {"name": "sse_held", "inputSchema": {"type": "object"}},
]
# The ttlMs this upstream reports for its tasks on tasks/get (tests change it).
TASK_TTL = web.AppKey("task_ttl", dict)
# Fields tasks/get reports for a task beyond the defaults (status, pollIntervalMs...): tests
# move a task by changing them.
TASK_STATE = web.AppKey("task_state", dict)
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
    app[HOLD] = asyncio.Event()
    app[TASK_TTL] = {}
    app[TASK_STATE] = {}
    app.router.add_post("/mcp", _handle)
    return app


async def _handle(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    message = orjson.loads(body)
    request.app[SEEN].append(
        {"headers": list(request.headers.items()), "body": body, "at": time.monotonic()}
    )
    method, request_id = message["method"], message.get("id")
    raw_id = orjson.dumps(request_id)
    if "id" not in message:  # a notification (a 2025-era client's initialized, say)
        return web.Response(status=202)
    if method == "initialize":  # the 2025 handshake: a session of its own, as FastMCP's
        version = message["params"].get("protocolVersion")
        result = {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": {}}
        answer = _result(raw_id, result)
        answer.headers["Mcp-Session-Id"] = f"echo-session-{len(request.app[SEEN])}"
        return answer
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
    if method.startswith("tasks/"):
        if str(message["params"].get("taskId")).startswith("hang-"):
            await request.app[RELEASE].wait()  # an owner that never answers in time
        if method == "tasks/update" and str(message["params"].get("taskId")).startswith("held-"):
            return await _held_stream(request, raw_id)
        return _task_answer(request, raw_id, method, message["params"])
    name = message["params"]["name"]
    arguments = message["params"].get("arguments") or {}
    if name in ("make_task", "make_task_sse"):
        task_id = arguments.get("task_id") or f"echo-task-{len(request.app[SEEN])}"
        ttl = arguments.get("ttl_ms", 60_000)
        request.app[TASK_TTL][task_id] = ttl
        created = _message(raw_id, _task(task_id, ttl, resultType="task"))
        if name == "make_task":
            return web.Response(body=created, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b": starting\n\n")
        await response.write(b"event: message\ndata: " + created + b"\n\n")
        if arguments.get("hold"):  # the stream stays open after the task's id
            await request.app[HOLD].wait()
        await response.write_eof()
        return response
    if name == "sse_held":
        return await _held_stream(request, raw_id)
    if name == "headers":
        seen = {"headers": [[k, v] for k, v in request.headers.items()]}
        return _result(raw_id, {"resultType": "complete", "content": [], "structuredContent": seen})
    if name == "sse_bytes":
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(SSE_BODY % raw_id)
        await response.write_eof()
        return response
    if name == "gzip":  # compressed although taskgate never asks for it
        compressed = gzip.compress(_message(raw_id, {"resultType": "complete", "content": []}))
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        return web.Response(body=compressed, headers=headers)
    if name == "html_503":
        return web.Response(status=503, text="<html>busy</html>", content_type="text/html")
    # "hang": answer only when the test releases it (or never, to test disconnects).
    await request.app[RELEASE].wait()
    return _result(raw_id, {"resultType": "complete", "content": []})


# The first event of a held stream: a progress notification, then the stream waits for HOLD.
HELD_FIRST = (
    b'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/progress",'
    b'"params":{"progressToken":"held","progress":1}}\n\n'
)


async def _held_stream(request: web.Request, raw_id: bytes) -> web.StreamResponse:
    """One event, then nothing until the test sets HOLD, then the response event."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(HELD_FIRST)
    await request.app[HOLD].wait()
    done = _message(raw_id, {"resultType": "complete", "content": []})
    await response.write(b"event: message\ndata: " + done + b"\n\n")
    await response.write_eof()
    return response


def _message(raw_id: bytes, result: dict[str, Any]) -> bytes:
    return b'{"jsonrpc":"2.0","id":' + raw_id + b',"result":' + orjson.dumps(result) + b"}"


def _result(raw_id: bytes, result: dict[str, Any]) -> web.Response:
    return web.Response(body=_message(raw_id, result), content_type="application/json")


def _task(task_id: str, ttl_ms: int | None, **extra: Any) -> dict[str, Any]:
    stamp = "2026-11-29T00:00:00Z"
    return {
        "taskId": task_id,
        "status": "working",
        "createdAt": stamp,
        "lastUpdatedAt": stamp,
        "ttlMs": ttl_ms,
        **extra,
    }


def _task_answer(
    request: web.Request, raw_id: bytes, method: str, params: dict[str, Any]
) -> web.Response:
    task_id = params.get("taskId")
    ttls = request.app[TASK_TTL]
    if task_id not in ttls:
        error = b'{"code":-32602,"message":"Task not found"}'
        body = b'{"jsonrpc":"2.0","id":' + raw_id + b',"error":' + error + b"}"
        return web.Response(status=400, body=body, content_type="application/json")
    if method == "tasks/get":
        assert isinstance(task_id, str)  # a key of `ttls`
        state = request.app[TASK_STATE].get(task_id, {})
        return _result(raw_id, _task(task_id, ttls[task_id], resultType="complete", **state))
    return _result(raw_id, {"resultType": "complete"})
