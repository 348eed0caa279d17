"""A 2025-era MCP client on the official Python SDK 1.x (`mcp<2`, ClientSession over
Streamable HTTP), as most Python clients deployed today are written: run by the bridge tests in
the venv of the 2025-era test servers (`make .venv-mcp1/.installed`), against taskgate's
front door or a server direct, to compare what it sees.

    python py_sdk1_client.py URL

In order: initialize, ping, tools/list, tools/call add, tools/call confirm (the server asks
through elicitation during the call; the callback accepts with ok: true), prompts/get greet,
resources/read note://readme, logging/setLevel error (the error code when refused), and where
it was taken and the server has a `shout` tool, tools/call shout, waiting for its error log
message (its debug one must not come). Prints ONE JSON object: each result as the SDK returned
it (model_dump, JSON mode), the questions it was asked, the log messages it got, and the
protocol version negotiated. Then, when the server offers resources.subscribe:
resources/subscribe note://readme, tools/call touch (waiting for its resources/updated),
resources/unsubscribe, tools/call touch again. Then, when the server offers tasks (2025-11-25):
tools/call report as a task, its tasks/result (blocking until it ends) and tasks/get; another
cancelled; tasks/list; tools/call approval as a task, whose questions come on its tasks/result
stream and are answered by the elicitation callback (ok: true).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.context import RequestContext
from mcp.shared.exceptions import McpError
from mcp.types import (
    CallToolResult,
    ElicitRequestParams,
    ElicitResult,
    LoggingMessageNotificationParams,
    ResourceUpdatedNotification,
    ServerNotification,
)
from pydantic import AnyUrl


async def run(url: str) -> dict[str, Any]:
    asked: list[str] = []

    logs: list[list[Any]] = []
    shouted = asyncio.Event()

    async def logged(params: LoggingMessageNotificationParams) -> None:
        logs.append([params.level, params.data])
        if params.level == "error":
            shouted.set()

    updates: list[str] = []
    updated = asyncio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, ServerNotification) and isinstance(
            message.root, ResourceUpdatedNotification
        ):
            updates.append(str(message.root.params.uri))
            updated.set()

    async def elicit(
        context: RequestContext[Any, Any], params: ElicitRequestParams
    ) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"ok": True})

    out: dict[str, Any] = {}
    async with (
        streamablehttp_client(url) as (read, write, _),
        ClientSession(
            read,
            write,
            elicitation_callback=elicit,
            logging_callback=logged,
            message_handler=on_message,
        ) as session,
    ):
        initialized = await session.initialize()
        out["protocolVersion"] = initialized.protocolVersion
        out["ping"] = (await session.send_ping()).model_dump(mode="json")
        tools = await session.list_tools()
        out["tools"] = sorted(tool.name for tool in tools.tools)
        out["add"] = (await session.call_tool("add", {"a": 2, "b": 3})).model_dump(mode="json")
        confirmed = await session.call_tool("confirm", {"question": "Proceed?"})
        out["confirm"] = confirmed.model_dump(mode="json")
        out["asked"] = asked
        out["prompt"] = (await session.get_prompt("greet", {"who": "Ada"})).model_dump(mode="json")
        read_back = await session.read_resource("note://readme")
        out["resource"] = read_back.model_dump(mode="json")
        try:
            await session.set_logging_level("error")
            out["setLevel"] = "ok"
        except McpError as refused:
            out["setLevel"] = refused.error.code
        if out["setLevel"] == "ok" and "shout" in out["tools"]:
            await session.call_tool("shout", {})
            await asyncio.wait_for(shouted.wait(), 20)
        out["logs"] = logs
        resources = initialized.capabilities.resources
        out["subscribe"] = bool(resources and resources.subscribe)
        if out["subscribe"]:
            await session.subscribe_resource(AnyUrl("note://readme"))
            touched = await session.call_tool("touch", {"uri": "note://readme"})
            await asyncio.wait_for(updated.wait(), 20)
            await session.unsubscribe_resource(AnyUrl("note://readme"))
            untouched = await session.call_tool("touch", {"uri": "note://readme"})
            out["touched"] = [touched.model_dump(mode="json"), untouched.model_dump(mode="json")]
        out["updates"] = updates
        if "poll_me" in out["tools"]:  # a server may move it to polling: the client resumes
            polled = await session.call_tool("poll_me", {})
            out["polled"] = polled.model_dump(mode="json")
        out["tasks"] = initialized.capabilities.tasks is not None
        if out["tasks"]:
            out.update(await _tasks(session))
        out["asked"] = asked
    return out


async def _tasks(session: ClientSession) -> dict[str, Any]:
    """The 2025-11-25 tasks of the server (tests/clients/ts1/server.mjs has them)."""
    tasks = session.experimental
    made = await tasks.call_tool_as_task("report", {"seconds": 0.2})
    result = await tasks.get_task_result(made.task.taskId, CallToolResult)
    status = await tasks.get_task(made.task.taskId)
    long = await tasks.call_tool_as_task("report", {"seconds": 60})
    cancelled = await tasks.cancel_task(long.task.taskId)
    listed = await tasks.list_tasks()
    asking = await tasks.call_tool_as_task("approval", {"questions": 1})
    approved = await tasks.get_task_result(asking.task.taskId, CallToolResult)
    return {
        # Without `_meta` (its related-task names the task, whose id is the server's draw).
        "task": [made.task.status, status.status, result.model_dump(mode="json", exclude={"meta"})],
        "cancelled": cancelled.status,
        "listed": sorted(task.status for task in listed.tasks),
        "approved": approved.model_dump(mode="json", exclude={"meta"}),
    }


def main() -> None:
    print(json.dumps(asyncio.run(run(sys.argv[1]))), flush=True)


if __name__ == "__main__":
    main()
