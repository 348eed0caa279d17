"""An MCP 2026-07-28 backend that answers at once: the upstream for benchmarks.

    python -m bench.instant_backend --port N

tools/call of `echo` answers a ~300-byte result; `make_task` creates a task; `hold` opens an
event stream, sends one event and then holds the stream open until the client leaves (an idle
stream, for bench/streams.py); tasks/get answers any task it created. Nothing else: it exists
to make the gateway's own cost visible.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from typing import Any

import orjson
from aiohttp import web

TASKS = web.AppKey("tasks", set)
STAMP = "2026-11-29T00:00:00Z"
META = {"io.modelcontextprotocol/serverInfo": {"name": "instant", "version": "1"}}


def make_app() -> web.Application:
    app = web.Application()
    app[TASKS] = set()
    app.router.add_post("/mcp", handle)
    return app


async def handle(request: web.Request) -> web.StreamResponse:
    message = orjson.loads(await request.read())
    method, params = message["method"], message.get("params", {})
    result: dict[str, Any]
    if method == "server/discover":
        result = {
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {}, "extensions": {"io.modelcontextprotocol/tasks": {}}},
            "ttlMs": 0,
            "cacheScope": "public",
        }
    elif method == "tools/list":
        schema = {"type": "object"}
        names = ("echo", "make_task", "hold")
        result = {"tools": [{"name": n, "inputSchema": schema} for n in names]}
    elif method == "tools/call" and params.get("name") == "hold":
        return await _hold(request)
    elif method == "tools/call" and params.get("name") == "make_task":
        task_id = secrets.token_urlsafe(24)
        request.app[TASKS].add(task_id)
        result = _task(task_id, resultType="task")
    elif method == "tools/call":
        text = "x" * 120
        result = {"content": [{"type": "text", "text": text}], "structuredContent": {"t": text}}
    elif method == "tasks/get" and params.get("taskId") in request.app[TASKS]:
        result = _task(params["taskId"])
    else:
        error = {"code": -32602, "message": "Task not found"}
        refusal = {"jsonrpc": "2.0", "id": message.get("id"), "error": error}
        return web.Response(status=400, body=orjson.dumps(refusal), content_type="application/json")
    result.setdefault("resultType", "complete")
    result["_meta"] = META
    body = orjson.dumps({"jsonrpc": "2.0", "id": message.get("id"), "result": result})
    return web.Response(body=body, content_type="application/json")


async def _hold(request: web.Request) -> web.StreamResponse:
    """An event stream that stays open and idle until the client disconnects."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b": held open\n\n")
    await asyncio.Event().wait()  # cancelled when the client goes away
    return response


def _task(task_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "taskId": task_id,
        "status": "working",
        "createdAt": STAMP,
        "lastUpdatedAt": STAMP,
        "ttlMs": 900_000,
        "pollIntervalMs": 1000,
        **extra,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="an instant MCP backend on loopback")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(
        make_app(),
        host="127.0.0.1",
        port=args.port,
        print=None,
        access_log=None,
        handler_cancellation=True,  # a held stream ends when its client leaves
    )
