"""A 2025-era MCP client on the official Python SDK 1.x (`mcp<2`, ClientSession over
Streamable HTTP), as most Python clients deployed today are written: run by the bridge tests in
the venv of the 2025-era test servers (`make .venv-mcp1/.installed`), against taskgate's
front door or a server direct, to compare what it sees.

    python py_sdk1_client.py URL

In order: initialize, ping, tools/list, tools/call add, tools/call confirm (the server asks
through elicitation during the call; the callback accepts with ok: true), prompts/get greet,
resources/read note://readme. Prints ONE JSON object: each result as the SDK returned it
(model_dump, JSON mode), the questions it was asked, and the protocol version negotiated.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.context import RequestContext
from mcp.types import ElicitRequestParams, ElicitResult


async def run(url: str) -> dict[str, Any]:
    asked: list[str] = []

    async def elicit(
        context: RequestContext[Any, Any], params: ElicitRequestParams
    ) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"ok": True})

    out: dict[str, Any] = {}
    async with (
        streamablehttp_client(url) as (read, write, _),
        ClientSession(read, write, elicitation_callback=elicit) as session,
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
    return out


def main() -> None:
    print(json.dumps(asyncio.run(run(sys.argv[1]))), flush=True)


if __name__ == "__main__":
    main()
