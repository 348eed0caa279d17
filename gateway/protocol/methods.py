"""The method table: what each MCP method is to taskgate and which param names it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gateway.protocol.codes import MethodError, RequestId


class MethodClass(Enum):
    """How taskgate serves a method; the handler dispatches on this, not on method strings."""

    DISCOVER = "discover"  # answered by taskgate from its backends
    LIST_TOOLS = "list"  # answered by taskgate, aggregated from its backends
    LIST_PROMPTS = "list-prompts"  # answered by taskgate from its catalogue, paged
    LIST_RESOURCES = "list-resources"  # answered by taskgate from its catalogue, paged
    LIST_TEMPLATES = "list-templates"  # answered by taskgate from its catalogue, paged
    CALL_TOOL = "call"  # routed by tool name through the route table
    GET_PROMPT = "prompt"  # routed by prompt name through the route table
    READ_RESOURCE = "resource"  # routed by URI: exact, glob or template match
    COMPLETE = "complete"  # routed by params.ref: a prompt name or an exact uriTemplate
    TASK = "task"  # routed by task id through the task-route store
    LISTEN = "listen"  # a stream taskgate serves itself (gateway/listen)


@dataclass(frozen=True, slots=True)
class MethodSpec:
    method: str
    cls: MethodClass
    # The param mirrored in Mcp-Name and used for routing, when the method has one.
    name_param: str | None = None
    # Whether the client must declare io.modelcontextprotocol/tasks to use the method.
    needs_tasks: bool = False


METHODS: dict[str, MethodSpec] = {
    spec.method: spec
    for spec in (
        MethodSpec("server/discover", MethodClass.DISCOVER),
        MethodSpec("tools/list", MethodClass.LIST_TOOLS),
        MethodSpec("tools/call", MethodClass.CALL_TOOL, name_param="name"),
        MethodSpec("prompts/list", MethodClass.LIST_PROMPTS),
        MethodSpec("prompts/get", MethodClass.GET_PROMPT, name_param="name"),
        MethodSpec("resources/list", MethodClass.LIST_RESOURCES),
        MethodSpec("resources/templates/list", MethodClass.LIST_TEMPLATES),
        MethodSpec("resources/read", MethodClass.READ_RESOURCE, name_param="uri"),
        MethodSpec("completion/complete", MethodClass.COMPLETE),
        MethodSpec("tasks/get", MethodClass.TASK, name_param="taskId", needs_tasks=True),
        MethodSpec("tasks/update", MethodClass.TASK, name_param="taskId", needs_tasks=True),
        MethodSpec("tasks/cancel", MethodClass.TASK, name_param="taskId", needs_tasks=True),
        MethodSpec("subscriptions/listen", MethodClass.LISTEN),
    )
}

# Mcp-Name must mirror these params (the core's table in basic/transports/streamable-http, plus
# the Tasks extension's taskId rule; docs/architecture.md, Sources), whether or not taskgate
# serves the method: the header check runs before the method check.
NAME_PARAMS: dict[str, str] = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
}

# Removed by SEP-2663 (docs/architecture.md, Sources); named so that the error says why rather
# than only "not found".
REMOVED = {
    "tasks/result": "tasks/result was removed in 2026-07-28; poll tasks/get",
    "tasks/list": "tasks/list was removed in 2026-07-28",
}


def classify(method: str, request_id: RequestId | None = None) -> MethodSpec:
    """The spec of a served method, or MethodError (-32601)."""
    spec = METHODS.get(method)
    if spec is None:
        reason = REMOVED.get(method, "taskgate does not serve this method")
        raise MethodError(f"Method not found: {method} ({reason})", request_id=request_id)
    return spec
