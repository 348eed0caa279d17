"""The `plain` demo backend: a FastMCP server *without* the Tasks extension, whose calls live only
as long as their request, for taskgate to run as tasks of its own (a route's `task.mode`).

`work` waits until `release` names its label (or its `wait_s` runs out), so a test holds a call
open as long as it likes without sleeping; `stats` says how many calls of a label started, were
cancelled and completed; `approve` asks one question first (`input_required`), `approve_both`
two at once; `big` answers as
many bytes as asked; `broken` answers isError."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import mcp_types
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError

from backends.report import approved_from, listen, parse_args, prepare_process, serve

APPROVE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}},
    "required": ["approved"],
}
MAX_WAIT_S = 600.0  # a held `work` call ends by itself at the latest after this


def build_server(replica: str) -> FastMCP:
    """The plain server of one replica."""
    mcp = FastMCP("plain")
    gates: dict[str, asyncio.Event] = {}
    counts: Counter[str] = Counter()

    def gate(label: str) -> asyncio.Event:
        if label not in gates:
            gates[label] = asyncio.Event()
        return gates[label]

    @mcp.tool
    async def work(label: str, wait_s: float = 30.0) -> dict[str, Any]:
        """Wait until `release(label)` (at most wait_s), then answer who did the work."""
        counts[f"{label}:started"] += 1
        try:
            async with asyncio.timeout(min(wait_s, MAX_WAIT_S)):
                await gate(label).wait()
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            counts[f"{label}:cancelled"] += 1
            raise
        counts[f"{label}:completed"] += 1
        return {"label": label, "replica": replica}

    @mcp.tool
    def release(label: str) -> str:
        """Let every `work` call of `label` (now and later) finish."""
        gate(label).set()
        return f"released {label}"

    @mcp.tool
    def stats(label: str) -> dict[str, int]:
        """How many `work` calls of `label` started, were cancelled and completed here."""
        return {
            "started": counts[f"{label}:started"],
            "cancelled": counts[f"{label}:cancelled"],
            "completed": counts[f"{label}:completed"],
        }

    @mcp.tool
    def quick(text: str) -> str:
        """Answer at once."""
        return f"{replica}:{text}"

    @mcp.tool
    async def approve(item: str, ctx: Context) -> dict[str, Any] | mcp_types.InputRequiredResult:
        """Ask whether to approve `item` (input_required), then say what was answered."""
        responses: Mapping[str, Any] | None = ctx.input_responses
        if not responses:
            params = mcp_types.ElicitRequestFormParams(
                message=f"Approve {item}?", requested_schema=APPROVE_SCHEMA
            )
            request = mcp_types.ElicitRequest(params=params)
            return mcp_types.InputRequiredResult(input_requests={"approval": request})
        return {"item": item, "approved": approved_from(responses), "replica": replica}

    @mcp.tool
    async def approve_both(
        first: str, second: str, ctx: Context
    ) -> dict[str, Any] | mcp_types.InputRequiredResult:
        """Ask two questions at once (input_required), then say what each was answered."""
        responses: Mapping[str, Any] | None = ctx.input_responses
        if not responses:
            asked = {
                key: mcp_types.ElicitRequest(
                    params=mcp_types.ElicitRequestFormParams(
                        message=f"Approve {item}?", requested_schema=APPROVE_SCHEMA
                    )
                )
                for key, item in (("first", first), ("second", second))
            }
            return mcp_types.InputRequiredResult(input_requests=asked)
        said = {key: approved_from({key: value}) for key, value in responses.items()}
        return {"answers": said, "replica": replica}

    @mcp.tool
    def big(size: int) -> str:
        """Answer `size` bytes of text."""
        return "x" * size

    @mcp.tool
    def broken(why: str) -> str:
        """Fail as a tool fails: a result with isError true."""
        raise ToolError(why)

    return mcp


def main(argv: Sequence[str] | None = None) -> int:
    """Run one replica until SIGTERM or SIGINT."""
    args = parse_args(argv)
    prepare_process(args.host)
    with listen(args.host, args.port) as sock:
        asyncio.run(serve(build_server(args.replica), sock, args.host))
    return 0


if __name__ == "__main__":
    sys.exit(main())
