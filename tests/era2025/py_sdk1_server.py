"""A 2025-era MCP server on the official Python SDK 1.x (`mcp<2`, FastMCP over Streamable
HTTP), as most Python servers deployed today are written: run by the bridge tests in a venv of
its own (`make .venv-mcp1/.installed`), never imported by taskgate.

    python py_sdk1_server.py [--port N] [--stateless] [--name NAME] [--marks-file F]

It prints `READY <url>` once it listens.
"""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

import anyio
import uvicorn
from mcp.server.fastmcp import Context, FastMCP
from mcp.types import Completion
from pydantic import BaseModel


def build(name: str, stateless: bool, marks_file: str) -> FastMCP:
    server = FastMCP(name, stateless_http=stateless)

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def whoami() -> str:
        """The server's own name: which replica answered."""
        return name

    @server.tool()
    def session_marker(ctx: Context) -> str:
        """A mark of the session the call came in (the same for each call of one session)."""
        return f"{name}:{id(ctx.session)}"

    @server.tool()
    async def wait(seconds: float, mark: str) -> str:
        """Wait; note `started <mark>` in --marks-file, and `cancelled <mark>` if cancelled."""
        _append(marks_file, f"started {mark}")
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            _append(marks_file, f"cancelled {mark}")
            raise
        return "waited"

    @server.tool()
    async def count(to: int, ctx: Context) -> str:
        """Count to `to`, reporting progress at each step."""
        for step in range(1, to + 1):
            await ctx.report_progress(step, to, f"step {step}")
        return f"counted to {to}"

    class Confirm(BaseModel):
        ok: bool

    @server.tool()
    async def confirm(question: str, ctx: Context) -> str:
        """Ask the client a yes/no question through elicitation."""
        answer = await ctx.elicit(question, Confirm)
        if answer.action == "accept" and answer.data is not None:
            return "yes" if answer.data.ok else "no"
        return answer.action

    @server.tool()
    async def survey(ctx: Context) -> str:
        """Ask two questions in turn, reporting progress after the first answer; note
        `cancelled survey` in --marks-file if cancelled while asking."""
        answers = []
        try:
            for step, question in enumerate(("first?", "second?"), start=1):
                answer = await ctx.elicit(question, Confirm)
                ok = answer.action == "accept" and answer.data is not None and answer.data.ok
                answers.append("yes" if ok else "no")
                await ctx.report_progress(step, 2, f"answered {question}")
        except anyio.get_cancelled_exc_class():
            _append(marks_file, "cancelled survey")
            raise
        return ",".join(answers)

    @server.prompt()
    def greet(who: str) -> str:
        """A greeting."""
        return f"Hello, {who}!"

    @server.resource("note://readme", mime_type="text/plain")
    def readme() -> str:
        return "a note"

    @server.resource("note://by/{topic}")
    def note(topic: str) -> str:
        return f"a note on {topic}"

    @server.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> Completion | None:
        """Topics for note://by/{topic} and names for greet, starting with what was typed."""
        choices = ["alpha", "albatross", "beta"]
        return Completion(values=[c for c in choices if c.startswith(argument.value)])

    return server


def _append(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as marks:
        marks.write(line + "\n")


class _Announcing(uvicorn.Server):
    """uvicorn's server, saying `READY <url>` on stdout once it listens (the tests' signal)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        print(f"READY http://{host}:{port}/mcp", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--name", default="py-sdk1")
    parser.add_argument("--stateless", action="store_true")
    parser.add_argument("--marks-file", default=os.devnull)
    args = parser.parse_args()
    app = build(args.name, args.stateless, args.marks_file).streamable_http_app()
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning")
    _Announcing(config).run()


if __name__ == "__main__":
    main()
