"""The `pushing` demo backend: an `mcp` SDK MCPServer (2.3.0) that serves subscriptions/listen
itself, so taskgate can relay `notifications/resources/updated` and `notifications/tasks` over
upstream listens.

Resources `notes://a` and `notes://b` and the template `notes://{name}`; the tool `touch(uri)`
publishes a resources/updated event for `uri` to this replica's listen streams (the SDK's
in-memory bus: an event is seen only by streams on the replica where it was published),
`whoami` names the replica and `listeners` counts the listen streams the replica holds.

A minimal Tasks extension (`io.modelcontextprotocol/tasks`, which the SDK does not implement),
its tasks in this replica's memory: `long_job(steps)` answers a CreateTaskResult; `tasks/get`,
`tasks/update` and `tasks/cancel`; the tool `advance(task_id, status)` moves a task (to
input_required with inputRequests, to completed with a result, ...) and pushes
`notifications/tasks` (the task as tasks/get returns it, less resultType) to every listen stream
of this replica that acknowledged its id. The listen handler acknowledges the `taskIds` this
replica knows (unknown ones are left out) beside what the SDK's own handler acknowledges.
`jobs_stats` counts the tasks/get calls and the listens served; `end_listens` ends this
replica's listen streams as a restart would, without forgetting its tasks.

Started as `python -m backends.pushing --port 0 --replica NAME`, it prints the same READY line
as backends/report.py once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import socket
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import anyio
import uvicorn
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import Context, MCPServer, require_client_extension
from mcp.server.subscriptions import (
    SUBSCRIPTION_ID_META_KEY,
    InMemorySubscriptionBus,
    ServerEvent,
    _honored_subset,
)
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import event_matches, event_to_notification
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    RequestParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
)
from mcp_types.jsonrpc import INTERNAL_ERROR, INVALID_REQUEST
from pydantic import Field

from backends.report import announce, listen, prepare_process

LISTEN_METHOD = "subscriptions/listen"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
TASK_NOTIFICATION = "notifications/tasks"
TERMINAL = frozenset({"completed", "failed", "cancelled"})
TTL_MS = 60_000
POLL_INTERVAL_MS = 5_000
MAX_LISTENS = 1024  # open listen streams per replica, as the SDK's ListenHandler allows
Status = Literal["working", "input_required", "completed", "failed", "cancelled"]
TaskWatcher = Callable[[dict[str, Any]], None]


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _not_found() -> MCPError:
    return MCPError(code=INVALID_PARAMS, message="Task not found")


class Jobs:
    """This replica's tasks, in memory, and the listen streams watching them."""

    def __init__(self, replica: str) -> None:
        self.replica = replica
        self.tasks: dict[str, dict[str, Any]] = {}  # id -> the DetailedTask, less resultType
        self._expiry: dict[str, float] = {}  # id -> when it is forgotten (monotonic)
        self._watchers: dict[object, tuple[frozenset[str], TaskWatcher]] = {}
        self.gets = 0  # tasks/get calls it was sent

    def create(self, steps: int) -> dict[str, Any]:
        now = time.monotonic()
        for task_id in [t for t, at in self._expiry.items() if at <= now]:
            del self.tasks[task_id], self._expiry[task_id]
        task_id = secrets.token_hex(16)
        stamp = _now()
        self.tasks[task_id] = {
            "taskId": task_id,
            "status": "working",
            "statusMessage": f"{steps} steps to go",
            "createdAt": stamp,
            "lastUpdatedAt": stamp,
            "ttlMs": TTL_MS,
            "pollIntervalMs": POLL_INTERVAL_MS,
        }
        self._expiry[task_id] = now + TTL_MS / 1000
        return dict(self.tasks[task_id])

    def get(self, task_id: str) -> dict[str, Any]:
        task = self.tasks.get(task_id)
        if task is None:
            raise _not_found()
        return dict(task)

    def move(self, task_id: str, status: Status, message: str | None = None) -> dict[str, Any]:
        """Move a live task to `status` (with what that status carries) and tell its watchers."""
        task = self.tasks.get(task_id)
        if task is None:
            raise _not_found()
        if task["status"] in TERMINAL:
            raise MCPError(code=INVALID_PARAMS, message=f"Task is already {task['status']}")
        for key in ("statusMessage", "inputRequests", "result", "error"):
            task.pop(key, None)
        task["status"] = status
        task["lastUpdatedAt"] = _now()
        if message is not None:
            task["statusMessage"] = message
        if status == "input_required":
            task["inputRequests"] = {f"{task_id}:confirm": _confirmation()}
        elif status == "completed":
            text = f"long_job {task_id} done on replica {self.replica}"
            task["result"] = {
                "content": [{"type": "text", "text": text}],
                "structuredContent": {"replica": self.replica},
                "isError": False,
            }
        elif status == "failed":
            task["error"] = {"code": INTERNAL_ERROR, "message": message or "long_job failed"}
        for ids, watcher in list(self._watchers.values()):
            if task_id in ids:
                watcher(dict(task))
        return dict(task)

    def watch(self, ids: frozenset[str], watcher: TaskWatcher) -> Callable[[], None]:
        """Call `watcher` with each move of a task in `ids`; returns the unwatch."""
        token = object()
        self._watchers[token] = (ids, watcher)

        def unwatch() -> None:
            self._watchers.pop(token, None)

        return unwatch

    @property
    def watched(self) -> int:
        """The listen streams that acknowledged at least one task id."""
        return sum(1 for ids, _ in self._watchers.values() if ids)


def _confirmation() -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {"confirmed": {"type": "boolean"}},
        "required": ["confirmed"],
    }
    params = {"mode": "form", "message": "Carry on with the job?", "requestedSchema": schema}
    return {"method": "elicitation/create", "params": params}


class TaskParams(RequestParams):
    task_id: str = Field(alias="taskId")
    input_responses: dict[str, Any] | None = None


class MiniTasks(Extension):
    """The Tasks extension, as far as the demo needs: `long_job` runs as a task."""

    identifier = TASKS_EXTENSION

    def __init__(self, jobs: Jobs) -> None:
        self._jobs = jobs

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if params.name != "long_job":
            return await call_next(ctx)
        require_client_extension(ctx, TASKS_EXTENSION)
        steps = (params.arguments or {}).get("steps", 1)
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise MCPError(code=INVALID_PARAMS, message="steps must be a positive integer")
        return {"resultType": "task", **self._jobs.create(steps)}

    def methods(self) -> Sequence[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskParams, self._get),
            MethodBinding("tasks/update", TaskParams, self._update),
            MethodBinding("tasks/cancel", TaskParams, self._cancel),
        ]

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        self._jobs.gets += 1
        require_client_extension(ctx, TASKS_EXTENSION)
        return {"resultType": "complete", **self._jobs.get(params.task_id)}

    async def _update(
        self, ctx: ServerRequestContext[Any, Any], params: TaskParams
    ) -> HandlerResult:
        require_client_extension(ctx, TASKS_EXTENSION)
        task = self._jobs.get(params.task_id)
        if task["status"] == "input_required" and params.input_responses:
            self._jobs.move(params.task_id, "working", "answered")
        return {"resultType": "complete"}

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskParams
    ) -> HandlerResult:
        require_client_extension(ctx, TASKS_EXTENSION)
        if self._jobs.get(params.task_id)["status"] not in TERMINAL:
            self._jobs.move(params.task_id, "cancelled")
        return {"resultType": "complete"}


class JobsListenHandler:
    """subscriptions/listen as the SDK's ListenHandler serves it (the bus's list and resource
    events), plus `taskIds`: the ids this replica knows are acknowledged and their moves sent
    as `notifications/tasks`. Keeps the SDK handler's `_streams` and `close()`."""

    def __init__(self, bus: InMemorySubscriptionBus, jobs: Jobs, *, max_buffered: int = 1024):
        self._bus = bus
        self._jobs = jobs
        self._max_buffered = max_buffered
        self.opened = 0  # listens served since the replica started
        self._streams: set[MemoryObjectSendStream[ServerEvent | dict[str, Any]]] = set()

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise MCPError(INVALID_REQUEST, "subscriptions/listen requires a request id")
        if len(self._streams) >= MAX_LISTENS:
            raise MCPError(INTERNAL_ERROR, "Subscription limit reached")
        self.opened += 1
        asked = (params.notifications.model_extra or {}).get("taskIds")
        if asked is not None:
            require_client_extension(ctx, TASKS_EXTENSION)
            if not isinstance(asked, list) or not all(isinstance(i, str) for i in asked):
                raise MCPError(INVALID_PARAMS, "notifications.taskIds must be an array of strings")
        honored = _honored_subset(params.notifications)
        uris = frozenset(honored.resource_subscriptions or ())
        acknowledged = honored.model_dump(by_alias=True, mode="json", exclude_none=True)
        task_ids: list[str] = []
        if asked is not None:
            task_ids = [i for i in dict.fromkeys(asked) if i in self._jobs.tasks]
            acknowledged["taskIds"] = task_ids
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        send, recv = anyio.create_memory_object_stream[ServerEvent | dict[str, Any]](
            self._max_buffered
        )

        def deliver(item: ServerEvent | dict[str, Any]) -> None:
            if not isinstance(item, dict) and not event_matches(honored, uris, item):
                return
            try:
                send.send_nowait(item)
            except anyio.ClosedResourceError:
                pass  # close() closed this stream; the loop below is unwinding
            except anyio.WouldBlock:
                self._streams.discard(send)  # a client that stopped reading: end its stream
                send.close()

        unsubscribe = self._bus.subscribe(deliver)
        unwatch = self._jobs.watch(frozenset(task_ids), deliver)
        self._streams.add(send)
        # raw: the SDK has no type for notifications/tasks (the ack, with taskIds, goes alike)
        outbound = ctx.session._request_outbound
        try:
            await outbound.notify(ACKNOWLEDGED, {"notifications": acknowledged, "_meta": meta})
            async for item in recv:
                if isinstance(item, dict):
                    await outbound.notify(TASK_NOTIFICATION, {**item, "_meta": meta})
                else:
                    notification = event_to_notification(item, meta)
                    await ctx.session.send_notification(
                        notification, related_request_id=subscription_id
                    )
        finally:
            unsubscribe()
            unwatch()
            self._streams.discard(send)
            send.close()
            recv.close()
        return SubscriptionsListenResult(_meta=meta)

    def close(self) -> None:
        """End every stream gracefully: what is buffered, then the listen's result."""
        for stream in list(self._streams):
            stream.close()


def build_server(replica: str) -> MCPServer:
    """One replica's MCPServer."""
    jobs = Jobs(replica)
    bus = InMemorySubscriptionBus()
    mcp = MCPServer(f"pushing-{replica}", extensions=[MiniTasks(jobs)], subscriptions=bus)
    handler = JobsListenHandler(bus, jobs)
    mcp._lowlevel_server.add_request_handler(
        LISTEN_METHOD, SubscriptionsListenRequestParams, handler
    )

    @mcp.resource("notes://a", mime_type="text/plain")
    def note_a() -> str:
        return f"Note a (replica {replica})."

    @mcp.resource("notes://b", mime_type="text/plain")
    def note_b() -> str:
        return f"Note b (replica {replica})."

    @mcp.resource("notes://{name}", mime_type="text/plain")
    def note(name: str) -> str:
        return f"Note {name} (replica {replica})."

    @mcp.tool()
    async def touch(uri: str, ctx: Context) -> str:
        """Tell this replica's listen streams that `uri` changed."""
        await ctx.notify_resource_updated(uri)
        return "ok"

    @mcp.tool()
    def whoami() -> dict[str, str]:
        """Name the replica that answered."""
        return {"replica": replica}

    @mcp.tool()
    def listeners() -> dict[str, int]:
        """How many subscriptions/listen streams this replica holds open."""
        return {"streams": listen_streams(mcp)}

    @mcp.tool()
    def long_job(steps: int) -> str:
        """A job of `steps` steps, run as a task (the tasks extension answers for it)."""
        return "declare the io.modelcontextprotocol/tasks extension"  # never reached

    @mcp.tool()
    def advance(task_id: str, status: Status, message: str | None = None) -> dict[str, Any]:
        """Move a task of this replica (input_required asks for a confirmation; completed
        carries a result; failed an error) and push notifications/tasks to its watchers."""
        return jobs.move(task_id, status, message)

    @mcp.tool()
    def jobs_stats() -> dict[str, Any]:
        """This replica's tasks, the tasks/get calls it was sent, the listens it served since it
        started and the open ones that watch a task."""
        return {
            "replica": replica,
            "tasks": len(jobs.tasks),
            "gets": jobs.gets,
            "listens": handler.opened,
            "task_streams": jobs.watched,
        }

    @mcp.tool()
    def end_listens() -> dict[str, int]:
        """End every listen stream of this replica gracefully (its result, then close), as a
        replica going away would, while it keeps its tasks."""
        ended = listen_streams(mcp)
        handler.close()
        return {"ended": ended}

    return mcp


def _listen_handler(mcp: MCPServer) -> Any:
    """The handler serving subscriptions/listen (JobsListenHandler above)."""
    handlers: dict[str, Any] = mcp._lowlevel_server._request_handlers
    return getattr(handlers.get(LISTEN_METHOD), "handler", None)


def listen_streams(mcp: MCPServer) -> int:
    """The open streams of the listen handler (its `_streams`)."""
    return len(getattr(_listen_handler(mcp), "_streams", ()))


class _Server(uvicorn.Server):
    """uvicorn, announcing READY once the app's lifespan is up and the socket accepts, and
    ending each listen stream gracefully (its result, then close) when asked to stop: an open
    stream would otherwise hold the stop until timeout_graceful_shutdown."""

    def __init__(self, config: uvicorn.Config, sock: socket.socket, mcp: MCPServer) -> None:
        super().__init__(config)
        self._sock = sock
        self._mcp = mcp

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.should_exit:
            announce(self._sock)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        handler = _listen_handler(self._mcp)
        if handler is not None:
            handler.close()
        await super().shutdown(sockets)


async def serve(mcp: MCPServer, sock: socket.socket) -> None:
    """Serve MCP over stateless streamable HTTP at /mcp until SIGTERM or SIGINT."""
    app = mcp.streamable_http_app(stateless_http=True)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
    await _Server(config, sock, mcp).serve(sockets=[sock])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m backends.pushing", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument("--replica", required=True, help="name reported by whoami")
    parser.add_argument("--host", default="127.0.0.1", help="loopback by default")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one replica until SIGTERM or SIGINT."""
    args = parse_args(argv)
    prepare_process(args.host)
    mcp = build_server(args.replica)
    with listen(args.host, args.port) as sock:
        asyncio.run(serve(mcp, sock))
    return 0


if __name__ == "__main__":
    sys.exit(main())
