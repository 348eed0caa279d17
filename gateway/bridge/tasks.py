"""Tasks of 2025-11-25 servers as the Tasks extension's, for 2026-07-28 clients.

A 2025-11-25 server that declares `capabilities.tasks.requests.tools.call` runs a tool whose
`execution.taskSupport` is `optional` or `required` as a task when the call carries
`params.task`: it answers at once with the task, nested (`{task: {taskId, status, ttl, ...}}`),
serves `tasks/get` (the status), `tasks/result` (the result, blocking until the task ends) and
`tasks/cancel`, each in the session that created the task (the TypeScript SDK keeps a task to
its session). So:

- a client that declares the extension gets the task as the extension's flat CreateTaskResult,
  once its route is recorded with the session it lives in ("<revision> <session id>", so any
  instance can reach it: TaskRoute.session), and the caller's session is kept open (never
  ended idle, evicted or at shutdown) for the route's life;
- `tasks/get` is the server's `tasks/get`, and once the task ended, its `tasks/result` inline:
  `result` (an `isError: true` result too: the extension's `completed`), or `error` for a
  JSON-RPC error (`failed`); `tasks/cancel` is the server's, answered `{resultType:
  "complete"}`;
- a client without the extension calling a `required` tool gets the tool's answer: taskgate
  creates the task and waits for its `tasks/result`, within the backend's timeout_s (a tool
  `optional` is left to the server, which then runs it inline).

The task's own questions (status `input_required`, asked through `tasks/result`) are the
extension's `inputRequests`, answered by `tasks/update` (gateway/bridge/task_input.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gateway.bridge.own_session import MAX_ANSWER, Opened, SessionGone, ask
from gateway.bridge.shapes import runs_tool_tasks
from gateway.bridge.task_input import TaskGone, TaskInput, without_related_task
from gateway.errors import BadGateway
from gateway.protocol.codes import Code, RequestId
from gateway.protocol.envelope import RPCRequest
from gateway.protocol.tasks import valid_task_id
from gateway.store.base import TaskRoute, now_ms
from gateway.upstream.calls import UpstreamCallError, UpstreamRPCError
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Replica

TERMINAL = frozenset({"completed", "failed", "cancelled"})
# What the server is asked for when taskgate makes the task (the extension lets the server
# decide; a 2025 server takes the client's wish): a day, as the route's own cap would bound it.
REQUESTED_TTL_MS = 24 * 3600 * 1000


class Recorder(Protocol):
    """How a task's route is made durable before its id is relayed (gateway/tasks/routes.py)."""

    def expires_at(self, created_at_ms: int, ttl_ms: int | None) -> int: ...

    async def record(
        self,
        route: TaskRoute,
        replica: Replica,
        request_id: RequestId,
        upstream_headers: dict[str, str],
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class TaskCall:
    """A tools/call the server may run as a task: the tool's `execution.taskSupport`, whether
    the client declared the extension, and where a task's route is recorded."""

    recorder: Recorder
    support: str
    extension: bool


def serves_tasks(opened: Opened) -> bool:
    """Whether the server said at initialize that it runs tools/call as tasks."""
    return runs_tool_tasks(opened.result.get("capabilities"))


def task_support(tool: dict[str, Any] | None) -> str:
    """A 2025-11-25 tool's `execution.taskSupport` (`forbidden` when it says nothing)."""
    execution = tool.get("execution") if tool is not None else None
    support = execution.get("taskSupport") if isinstance(execution, dict) else None
    return support if support in ("optional", "required") else "forbidden"


def session_of(opened: Opened) -> str:
    """The route's record of the session a task lives in."""
    return f"{opened.version} {opened.session_id}"


def opened_of(session: str) -> Opened:
    """The session a route names, to send its task's methods in."""
    version, _, session_id = session.partition(" ")
    return Opened(session_id, version, {})


def with_task(sent: RPCRequest) -> RPCRequest:
    """The call, asking the server to run it as a task."""
    params = {**sent.params, "task": {"ttl": REQUESTED_TTL_MS}}
    body = orjson.dumps({"jsonrpc": "2.0", "id": sent.id, "method": sent.method, "params": params})
    return RPCRequest(sent.id, sent.method, params, body)


def nested_task(message: Any, request_id: RequestId) -> dict[str, Any] | None:
    """The task a server's answer to the call created, or None (an error, an inline answer)."""
    if not isinstance(message, dict) or message.get("id") != request_id:
        return None
    result = message.get("result")
    task = result.get("task") if isinstance(result, dict) else None
    return task if isinstance(task, dict) else None


def flat(task: dict[str, Any]) -> dict[str, Any]:
    """A 2025-11-25 Task as the extension's: `ttl` and `pollInterval` (milliseconds already)
    as `ttlMs` and `pollIntervalMs`."""
    shaped: dict[str, Any] = {
        key: task[key]
        for key in ("taskId", "status", "statusMessage", "createdAt", "lastUpdatedAt")
        if key in task
    }
    ttl = task.get("ttl")
    shaped["ttlMs"] = ttl if isinstance(ttl, int) and not isinstance(ttl, bool) else None
    interval = task.get("pollInterval")
    if isinstance(interval, int) and not isinstance(interval, bool):
        shaped["pollIntervalMs"] = interval
    return shaped


def created(task: dict[str, Any]) -> dict[str, Any]:
    """The extension's CreateTaskResult of a server's new task."""
    return {"resultType": "task", **flat(task)}


def route_of(
    recorder: Recorder,
    task: dict[str, Any],
    replica: Replica,
    tenant: str,
    principal: str,
    opened: Opened,
    request_id: RequestId,
) -> TaskRoute:
    """The route of a task a server created; BadGateway when its id is not one."""
    task_id = task.get("taskId")
    if not valid_task_id(task_id):
        raise BadGateway(
            f"Bad gateway: backend {replica.backend!r} answered a task without a valid taskId",
            request_id=request_id,
        )
    assert isinstance(task_id, str)
    ttl = flat(task)["ttlMs"]
    now = now_ms()
    return TaskRoute(
        task_id=task_id,
        backend=replica.backend,
        replica=replica.url,
        tenant=tenant,
        principal=principal,
        created_at_ms=now,
        ttl_ms=ttl,
        expires_at_ms=recorder.expires_at(now, ttl),
        session=session_of(opened),
    )


async def snapshot(
    asks: TaskInput,
    replica: Replica,
    route: TaskRoute,
    headers: dict[str, str],
    timeout_s: float,
) -> dict[str, Any]:
    """The extension's tasks/get result of a 2025-era task: the server's status, its questions
    while it waits for input (gateway/bridge/task_input.py), and once it ended, its
    tasks/result inline. TaskGone when the server no longer knows it."""
    pool = asks.pool
    opened = opened_of(route.session)
    task = await _task_asked(pool, replica, opened, headers, "tasks/get", route, timeout_s)
    shaped: dict[str, Any] = {"resultType": "complete", **flat(task)}
    status = shaped.get("status")
    if status == "input_required":
        requests = await asks.outstanding(replica, opened, route, headers, timeout_s)
        shaped["inputRequests"] = requests
        return shaped
    if status not in ("completed", "failed"):
        return shaped
    try:
        result = await _task_asked(
            pool,
            replica,
            opened,
            headers,
            "tasks/result",
            route,
            timeout_s,
            max_bytes=replica.max_answer_bytes,
        )
    except UpstreamRPCError as failed:  # the task's own failure, as a JSON-RPC error
        shaped["status"] = "failed"
        shaped["error"] = {"code": failed.code, "message": failed.said.get("message", "")}
        return shaped
    result = without_related_task(result)
    # isError: true was `failed` in 2025-11-25; the extension calls it `completed`.
    shaped["status"] = "completed"
    shaped["result"] = {"resultType": "complete", **result}
    return shaped


async def update(
    asks: TaskInput,
    replica: Replica,
    route: TaskRoute,
    headers: dict[str, str],
    responses: dict[str, Any],
    timeout_s: float,
) -> dict[str, Any]:
    """The extension's tasks/update of a 2025-era task: each answer POSTed on its session as
    the answer to the server's question."""
    opened = opened_of(route.session)
    await asks.answer(replica, opened, route, headers, responses, timeout_s)
    return {"resultType": "complete"}


async def cancel(
    pool: Pool, replica: Replica, route: TaskRoute, headers: dict[str, str], timeout_s: float
) -> dict[str, Any]:
    """The extension's tasks/cancel of a 2025-era task: the server's tasks/cancel; one that had
    ended already is answered as cancelled too (the extension's cancel may find it ended)."""
    opened = opened_of(route.session)
    try:
        await _task_asked(pool, replica, opened, headers, "tasks/cancel", route, timeout_s)
    except TaskGone:
        # 2025-11-25 refuses to cancel a task that ended (-32602): known, it is ended.
        task = await _task_asked(pool, replica, opened, headers, "tasks/get", route, timeout_s)
        if task.get("status") not in TERMINAL:
            raise
    return {"resultType": "complete"}


async def run_to_end(
    pool: Pool,
    replica: Replica,
    opened: Opened,
    headers: dict[str, str],
    sent: RPCRequest,
    timeout_s: float,
    cancel_later: Callable[[bytes], None],
) -> bytes:
    """A `required` tool's call for a client without the extension: the task made, and its
    tasks/result (blocking until it ends) as the call's answer, within `timeout_s`; a task
    left unfinished is cancelled upstream (`cancel_later(body)` POSTs on the session)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    params = with_task(sent).params
    made = await _asked(  # never sent twice: it makes a task
        pool, replica, opened, headers, "tools/call", params, timeout_s, idempotent=False
    )
    task = made.get("task")
    task_id = task.get("taskId") if isinstance(task, dict) else None
    if not valid_task_id(task_id):
        raise BadGateway(
            f"Bad gateway: backend {replica.backend!r} answered a task without a valid taskId",
            request_id=sent.id,
        )
    try:
        result = await _asked(
            pool,
            replica,
            opened,
            headers,
            "tasks/result",
            {"taskId": task_id},
            max(deadline - loop.time(), 0.001),
            max_bytes=replica.max_answer_bytes,
        )
    except UpstreamRPCError as failed:
        return orjson.dumps({"jsonrpc": "2.0", "id": sent.id, "error": failed.said})
    except BaseException:
        cancel = {"jsonrpc": "2.0", "id": f"taskgate-cancel-{task_id}", "method": "tasks/cancel"}
        cancel_later(orjson.dumps({**cancel, "params": {"taskId": task_id}}))
        raise
    shaped = {"resultType": "complete", **result}
    return orjson.dumps({"jsonrpc": "2.0", "id": sent.id, "result": shaped})


async def _task_asked(
    pool: Pool,
    replica: Replica,
    opened: Opened,
    headers: dict[str, str],
    method: str,
    route: TaskRoute,
    timeout_s: float,
    *,
    max_bytes: int = MAX_ANSWER,
) -> dict[str, Any]:
    """`method` of the route's task on its session; TaskGone when the server does not know
    it (a 404 of the session, or -32602 but from tasks/result, whose errors are the task's)."""
    params = {"taskId": route.task_id}
    try:
        return await _asked(
            pool, replica, opened, headers, method, params, timeout_s, max_bytes=max_bytes
        )
    except SessionGone:
        raise TaskGone from None
    except UpstreamRPCError as refused:
        if refused.code == Code.INVALID_PARAMS and method != "tasks/result":
            raise TaskGone from None
        raise


async def _asked(
    pool: Pool,
    replica: Replica,
    opened: Opened,
    headers: dict[str, str],
    method: str,
    params: dict[str, Any],
    timeout_s: float,
    *,
    max_bytes: int = MAX_ANSWER,
    idempotent: bool = True,
) -> dict[str, Any]:
    """`method` on the session: its result, UpstreamRPCError (the server said no), SessionGone,
    or the wire's failure as a client's request gets it."""
    try:
        return await ask(
            pool,
            replica,
            opened,
            headers,
            method,
            params,
            timeout_s,
            max_bytes=max_bytes,
            idempotent=idempotent,
        )
    except UpstreamRPCError:
        raise
    except UpstreamCallError as failed:
        if isinstance(failed, SessionGone):
            raise
        if failed.cause is not None:
            raise failed.cause from None
        raise BadGateway(f"Bad gateway: {failed}") from None
