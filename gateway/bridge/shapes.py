"""2025-era answers in the shapes of 2026-07-28: a server/discover result made from a 2025-era
server's initialize result (which is what the catalogue keeps of every backend)."""

from __future__ import annotations

from typing import Any

from gateway.bridge.era import MODERN
from gateway.protocol.meta import SERVER_INFO_KEY, TASKS_EXTENSION

# The capabilities of a 2025-era server that taskgate serves through its sessions. Their
# settings are left out: `listChanged` and `subscribe` mean notifications on the 2025 session's
# streams, which taskgate does not read (its lists are compared at each refresh instead,
# gateway/listen/lists.py); kept, they would have taskgate ask the backend for a 2026-07-28
# subscriptions/listen it does not serve. The 2025-11-25 `tasks` capability is not the Tasks
# extension and is never advertised in 2026-07-28; a server that runs tools/call as tasks is
# said to serve the extension instead (gateway/bridge/tasks.py serves it).
SERVED = ("tools", "prompts", "resources", "completions", "logging")


def discover_of(initialized: dict[str, Any]) -> dict[str, Any]:
    """The server/discover result taskgate keeps for a 2025-era server, from its initialize
    result: what it serves, its instructions and serverInfo. `supportedVersions` names the
    revision taskgate speaks for it to clients."""
    declared = initialized.get("capabilities")
    capabilities: dict[str, Any] = {
        name: {}
        for name in SERVED
        if isinstance(declared, dict) and declared.get(name) not in (None, False)
    }
    result: dict[str, Any] = {
        "resultType": "complete",
        "supportedVersions": [MODERN],
        "capabilities": capabilities,
        "ttlMs": 0,
        "cacheScope": "private",
    }
    if runs_tool_tasks(declared):  # 2025-11-25 tasks, served as the extension's
        capabilities["extensions"] = {TASKS_EXTENSION: {}}
    instructions = initialized.get("instructions")
    if isinstance(instructions, str):
        result["instructions"] = instructions
    server_info = initialized.get("serverInfo")
    if isinstance(server_info, dict):
        result["_meta"] = {SERVER_INFO_KEY: server_info}
    return result


def runs_tool_tasks(declared: Any) -> bool:
    """Whether 2025-era server capabilities say tools/call runs as a task."""
    tasks = declared.get("tasks") if isinstance(declared, dict) else None
    requests = tasks.get("requests") if isinstance(tasks, dict) else None
    tools = requests.get("tools") if isinstance(requests, dict) else None
    return isinstance(tools, dict) and isinstance(tools.get("call"), dict)


def completed(message: dict[str, Any], method: str) -> dict[str, Any]:
    """A 2025-era server's answer to a call, in the 2026-07-28 shape: its result gets
    `resultType: "complete"` (resources/read is cacheable there, and taskgate cannot know for
    how long: not at all, and for this caller only). An error, or a result already shaped, is
    left as it is."""
    result = message.get("result")
    if not isinstance(result, dict) or "resultType" in result:
        return message
    shaped: dict[str, Any] = {"resultType": "complete", **result}
    if method == "resources/read":
        shaped.setdefault("ttlMs", 0)
        shaped.setdefault("cacheScope", "private")
    return {**message, "result": shaped}
