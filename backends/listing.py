"""The `listing` demo backend: the pushing backend (backends/pushing.py, an `mcp` SDK MCPServer
that serves subscriptions/listen) whose tools and prompts change while it runs, each change
pushed as `notifications/{tools,prompts}/list_changed` to this replica's listen streams.

Besides the pushing backend's tools and resources, and one prompt, `greeting`:

- `set_tool(tool, on)` adds (or removes) the tool named `tool` and pushes tools/list_changed;
  `set_prompt(prompt, on)` does the same for a prompt and prompts/list_changed;
- `announce(kind, count)` pushes `count` list_changed of `kind` ("tools", "prompts",
  "resources") and changes nothing, then `set_tool`s `then_tool` when named: a burst of pushes
  with one real change at its end;
- `test_trigger_tool_change` and `test_trigger_prompt_change` are the hooks the official
  conformance suite (`@modelcontextprotocol/conformance`, scenario server-stateless, the sep-2575
  checks "server sends tools/prompts list_changed on subscription") calls: each adds one more
  tool (prompt) and pushes the list_changed.

Events live on the replica where they happen (the SDK's in-memory bus), as with the pushing
backend. Started as `python -m backends.listing --port 0 --replica NAME`; the same READY line.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from typing import Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import Prompt

from backends.pushing import build_server, parse_args, serve
from backends.report import listen, prepare_process

Kind = Literal["tools", "prompts", "resources"]
MAX_ANNOUNCE = 10_000  # one call's burst


def _added_tool(name: str) -> Callable[[], str]:
    def tool() -> str:
        return f"{name} was added while the server ran"

    tool.__name__ = name
    tool.__doc__ = f"A tool `set_tool` added: {name}."
    return tool


def _added_prompt(name: str) -> Prompt:
    def prompt() -> str:
        return f"The prompt {name}, added while the server ran."

    return Prompt.from_function(prompt, name=name, description=f"A prompt added: {name}.")


async def _changed(ctx: Context, kind: Kind) -> None:
    if kind == "tools":
        await ctx.notify_tools_changed()
    elif kind == "prompts":
        await ctx.notify_prompts_changed()
    else:
        await ctx.notify_resources_changed()


def add_listing_tools(mcp: MCPServer) -> None:
    """The tools and the prompt that change what `mcp` lists (see the module docstring)."""
    tools: set[str] = set()
    prompts: set[str] = set()
    triggered = {"tools": 0, "prompts": 0}

    def set_tool_now(name: str, on: bool) -> None:
        if on and name not in tools:
            mcp.add_tool(_added_tool(name), name=name)
            tools.add(name)
        elif not on and name in tools:
            mcp.remove_tool(name)
            tools.discard(name)

    @mcp.prompt()
    def greeting() -> str:
        """A prompt that is always there."""
        return "Hello."

    @mcp.tool()
    async def set_tool(tool: str, on: bool, ctx: Context) -> dict[str, bool]:
        """Add (on) or remove (off) the tool named `tool`, and push tools/list_changed."""
        set_tool_now(tool, on)
        await _changed(ctx, "tools")
        return {"on": tool in tools}

    @mcp.tool()
    async def set_prompt(prompt: str, on: bool, ctx: Context) -> dict[str, bool]:
        """Add (on) or remove (off) the prompt named `prompt`, and push prompts/list_changed."""
        if on and prompt not in prompts:
            mcp.add_prompt(_added_prompt(prompt))
            prompts.add(prompt)
        elif not on and prompt in prompts:
            mcp.remove_prompt(prompt)
            prompts.discard(prompt)
        await _changed(ctx, "prompts")
        return {"on": prompt in prompts}

    @mcp.tool()
    async def announce(
        kind: Kind, count: int, ctx: Context, then_tool: str | None = None
    ) -> dict[str, int]:
        """Push `count` list_changed of `kind` without changing anything; then, when
        `then_tool` is named, add that tool and push tools/list_changed once more."""
        count = max(0, min(count, MAX_ANNOUNCE))
        for _ in range(count):
            await _changed(ctx, kind)
        if then_tool is not None:
            set_tool_now(then_tool, True)
            await _changed(ctx, "tools")
        return {"pushed": count + (then_tool is not None)}

    @mcp.tool()
    async def test_trigger_tool_change(ctx: Context) -> str:
        """The conformance suite's hook: one more tool, and tools/list_changed."""
        triggered["tools"] += 1
        set_tool_now(f"conformance_tool_{triggered['tools']}", True)
        await _changed(ctx, "tools")
        return "ok"

    @mcp.tool()
    async def test_trigger_prompt_change(ctx: Context) -> str:
        """The conformance suite's hook: one more prompt, and prompts/list_changed."""
        triggered["prompts"] += 1
        name = f"conformance_prompt_{triggered['prompts']}"
        mcp.add_prompt(_added_prompt(name))
        prompts.add(name)
        await _changed(ctx, "prompts")
        return "ok"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one replica until SIGTERM or SIGINT."""
    args = parse_args(argv)
    prepare_process(args.host)
    mcp = build_server(args.replica)
    add_listing_tools(mcp)
    with listen(args.host, args.port) as sock:
        asyncio.run(serve(mcp, sock))
    return 0


if __name__ == "__main__":
    sys.exit(main())
