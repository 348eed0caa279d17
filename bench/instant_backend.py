"""An MCP backend that answers at once, in the 2026-07-28 era and the 2025 one: the upstream
for benchmarks.

    python -m bench.instant_backend --port N [--no-tasks]

2026-07-28 (a request whose params carry `_meta`): server/discover; tools/list; tools/call of
`echo` (or any other name) answers a ~300-byte result; `make_task` creates a task; `slow` answers
as `echo` does after `arguments.ms` milliseconds (default 2000: a held call, for
bench/isolation.py); `hold` opens an event stream, sends one event and then holds the
stream open until the client leaves (an idle stream, for bench/streams.py); tasks/get answers
any task it created. Anything else gets 400 "Task not found".

The 2025 era (a request whose params have no `_meta`; bench/legacy.py): `initialize` answers the
client's protocolVersion when it is 2025-03-26, 2025-06-18 or 2025-11-25 (else 2025-11-25), with
a fresh Mcp-Session-Id header, remembered among the newest MAX_SESSIONS (the oldest forgotten).
Every other request must carry a remembered Mcp-Session-Id: none is 400, an unknown one 404
"Session not found" (as a 2025-era server answers). Then tools/list (`echo` alone) and
tools/call of `echo` (or any other name) answer in the 2025 shape (no resultType, no _meta);
`make_task` and `hold` are unknown tools there (-32602), ping answers {}, any other method is
-32601 (JSON-RPC errors with HTTP 200). DELETE with a remembered session forgets it (200);
GET (a server's event stream) is 405.

Any notification (a message without an id), of either era, gets 202 with no body. Nothing else:
it exists to make the gateway's own cost visible.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from typing import Any

import orjson
from aiohttp import web

TASKS = web.AppKey("tasks", set)
CAPABILITIES = web.AppKey("capabilities", dict)
# The 2025-era sessions opened, oldest first (a dict keeps insertion order): bounded, so that a
# client that never sends DELETE cannot grow the process without end.
SESSIONS = web.AppKey("sessions", dict)
MAX_SESSIONS = 10_000
LEGACY_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
SESSION_HEADER = "Mcp-Session-Id"
STAMP = "2026-11-29T00:00:00Z"
META = {"io.modelcontextprotocol/serverInfo": {"name": "instant", "version": "1"}}
JSON = "application/json"
SLOW_MS = 2000  # how long `slow` takes when its arguments name no `ms`


def make_app(*, tasks: bool = True) -> web.Application:
    """`tasks`: whether discover declares the Tasks extension (off: a server without tasks,
    whose calls taskgate may run as tasks of its own, bench/made.py)."""
    app = web.Application()
    extensions: dict[str, Any] = {"io.modelcontextprotocol/tasks": {}} if tasks else {}
    app[CAPABILITIES] = {"tools": {}, "extensions": extensions}
    app[TASKS] = set()
    app[SESSIONS] = {}
    app.router.add_post("/mcp", handle)
    app.router.add_delete("/mcp", end_session)
    app.router.add_get("/mcp", no_stream)
    return app


async def handle(request: web.Request) -> web.StreamResponse:
    message = orjson.loads(await request.read())
    if "id" not in message:  # a notification: nothing to answer, in either era
        return web.Response(status=202)
    params = message.get("params", {})
    if "_meta" not in params:
        return _legacy(request, message["id"], message["method"], params)
    method = message["method"]
    result: dict[str, Any]
    if method == "server/discover":
        result = {
            "supportedVersions": ["2026-07-28"],
            "capabilities": request.app[CAPABILITIES],
            "ttlMs": 0,
            "cacheScope": "public",
        }
    elif method == "tools/list":
        schema = {"type": "object"}
        names = ("echo", "make_task", "hold", "slow")
        result = {"tools": [{"name": n, "inputSchema": schema} for n in names]}
    elif method == "tools/call" and params.get("name") == "hold":
        return await _hold(request)
    elif method == "tools/call" and params.get("name") == "slow":
        ms = params.get("arguments", {}).get("ms", SLOW_MS)
        await asyncio.sleep(float(ms) / 1000)  # a tool that takes its time (bench/isolation.py)
        result = _echo()
    elif method == "tools/call" and params.get("name") == "make_task":
        task_id = secrets.token_urlsafe(24)
        request.app[TASKS].add(task_id)
        result = _task(task_id, resultType="task")
    elif method == "tools/call":
        result = _echo()
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


def _legacy(
    request: web.Request, request_id: Any, method: str, params: dict[str, Any]
) -> web.Response:
    """One 2025-era request: initialize opens a session, everything else needs one."""
    sessions: dict[str, None] = request.app[SESSIONS]
    result: dict[str, Any]
    if method == "initialize":
        asked = params.get("protocolVersion")
        version = asked if asked in LEGACY_VERSIONS else LEGACY_VERSIONS[-1]
        session_id = secrets.token_urlsafe(24)
        sessions[session_id] = None
        if len(sessions) > MAX_SESSIONS:
            del sessions[next(iter(sessions))]  # the oldest
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "instant", "version": "1"},
        }
        headers = {SESSION_HEADER: session_id}
        return web.Response(body=_answer(request_id, result), headers=headers, content_type=JSON)
    refused = _session_refusal(request)
    if refused is not None:
        return refused
    if method == "tools/list":
        schema = {"type": "object"}
        result = {"tools": [{"name": "echo", "inputSchema": schema}]}
    elif method == "tools/call" and params.get("name") in ("make_task", "hold"):
        # Tasks and held streams are the 2026-07-28 benchmarks'; no 2025-era one uses them.
        tool = params["name"]
        return _error(request_id, -32602, f"Unknown tool: {tool} (not in the 2025 era here)")
    elif method == "tools/call":
        result = _echo()
    elif method == "ping":
        result = {}
    else:
        return _error(request_id, -32601, f"Method not found: {method}")
    return web.Response(body=_answer(request_id, result), content_type=JSON)


def _error(request_id: Any, code: int, message: str) -> web.Response:
    """A JSON-RPC error with HTTP 200, as a 2025-era server answers a request it refuses."""
    error = {"code": code, "message": message}
    body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": error})
    return web.Response(body=body, content_type=JSON)


def _session_refusal(request: web.Request) -> web.Response | None:
    """400 without Mcp-Session-Id, 404 for one this backend does not remember, else None."""
    session_id = request.headers.get(SESSION_HEADER)
    if session_id is None:
        message, status = "Bad Request: Mcp-Session-Id header is required", 400
    elif session_id not in request.app[SESSIONS]:
        message, status = "Session not found", 404
    else:
        return None
    error = {"code": -32600, "message": message}
    body = orjson.dumps({"jsonrpc": "2.0", "id": None, "error": error})
    return web.Response(status=status, body=body, content_type=JSON)


async def end_session(request: web.Request) -> web.Response:
    """DELETE: a 2025-era client ends its session."""
    refused = _session_refusal(request)
    if refused is not None:
        return refused
    del request.app[SESSIONS][request.headers[SESSION_HEADER]]
    return web.Response(status=200)


async def no_stream(request: web.Request) -> web.Response:
    """GET: this backend offers no server-to-client stream (the 2025 era's 405)."""
    return web.Response(status=405, headers={"Allow": "POST, DELETE"})


def _echo() -> dict[str, Any]:
    text = "x" * 120
    return {"content": [{"type": "text", "text": text}], "structuredContent": {"t": text}}


def _answer(request_id: Any, result: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})


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
    parser.add_argument(
        "--no-tasks", action="store_true", help="discover declares no Tasks extension"
    )
    args = parser.parse_args()
    web.run_app(
        make_app(tasks=not args.no_tasks),
        host="127.0.0.1",
        port=args.port,
        print=None,
        access_log=None,
        handler_cancellation=True,  # a held stream ends when its client leaves
    )
