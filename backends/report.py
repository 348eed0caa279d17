"""The `report` demo backend: a FastMCP server with one task tool and a few probes."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any

import mcp_types
from fastmcp import Context, FastMCP
from fastmcp_tasks import TasksExtension

# pydantic needs typing_extensions' TypedDict before Python 3.12 to build the output schema.
from typing_extensions import TypedDict

APPROVE_KEY = "approve_outline"
APPROVE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}},
    "required": ["approved"],
}

# Process-wide, not per-server: tests read them through `stats` to see what a
# client disconnect did to an in-flight `slow_count`.
SLOW_COUNTS: Counter[str] = Counter()


class ReportResult(TypedDict):
    """The structured result of a finished `generate_report`."""

    size: str
    approved: bool
    replica: str


def approval_request(size: str) -> mcp_types.InputRequiredResult:
    """The single elicitation `generate_report` asks before it finishes."""
    params = mcp_types.ElicitRequestFormParams(
        message=f"Approve the outline of the {size} report?",
        requested_schema=APPROVE_SCHEMA,
    )
    request = mcp_types.ElicitRequest(params=params)
    return mcp_types.InputRequiredResult(input_requests={APPROVE_KEY: request})


def approved_from(responses: Mapping[str, Any]) -> bool:
    """Read the one approval answer, whatever key it arrived under.

    On the wire a task's request travels under a key the tasks extension mints
    (`<taskId>:<hex>`) and is translated back before the next leg; a foreground
    call is answered under our own key. Only one request is ever outstanding, so
    the single response is the answer, an `ElicitResult` or a plain dict. A
    declined or cancelled elicitation counts as not approved.
    """
    (answer,) = responses.values()
    if isinstance(answer, Mapping):
        action, content = answer.get("action"), answer.get("content")
    else:
        action, content = getattr(answer, "action", None), getattr(answer, "content", None)
    return action == "accept" and isinstance(content, Mapping) and content.get("approved") is True


def build_server(replica: str, tasks_url: str = "memory://") -> FastMCP:
    """Build the report server for one replica, its tasks stored at `tasks_url`."""
    mcp = FastMCP("report")
    mcp.add_extension(TasksExtension(url=tasks_url))

    @mcp.tool(task=True)
    async def generate_report(
        size: str, ctx: Context
    ) -> ReportResult | mcp_types.InputRequiredResult:
        """Generate a report after the client approves its outline."""
        responses = ctx.input_responses
        if not responses:
            return approval_request(size)
        return ReportResult(size=size, approved=approved_from(responses), replica=replica)

    @mcp.tool
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @mcp.tool
    def whoami() -> dict[str, str]:
        """Name the replica that answered."""
        return {"replica": replica}

    @mcp.tool
    async def slow_count(n: int, delay_ms: int, ctx: Context) -> int:
        """Count to n, reporting progress each step, pausing delay_ms between steps."""
        SLOW_COUNTS["started"] += 1
        try:
            for i in range(1, n + 1):
                await asyncio.sleep(delay_ms / 1000)
                await ctx.report_progress(i, n)
        except asyncio.CancelledError:
            SLOW_COUNTS["cancelled"] += 1
            raise
        SLOW_COUNTS["completed"] += 1
        return n

    @mcp.tool
    def stats() -> dict[str, Any]:
        """Report how many slow_count calls started, were cancelled and completed."""
        return {
            "replica": replica,
            "slow_started": SLOW_COUNTS["started"],
            "slow_cancelled": SLOW_COUNTS["cancelled"],
            "slow_completed": SLOW_COUNTS["completed"],
        }

    return mcp


def listen(host: str, port: int) -> socket.socket:
    """Bind and listen ourselves so `--port 0` yields a port we can announce."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def announce(sock: socket.socket) -> str:
    """Print the one READY line a parent process waits for."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/mcp"
    print(f"READY {url}", flush=True)
    return url


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    """Exit quietly; uvicorn re-raises SIGTERM/SIGINT here after a graceful stop."""
    raise SystemExit(0)


async def serve(mcp: FastMCP, sock: socket.socket, host: str) -> None:
    """Serve MCP over streamable HTTP at /mcp; announce once the lifespans are up.

    READY waits for the server's started event (set after the task store and
    its worker are running), so a broken --tasks-url fails before READY rather
    than on a test's first request. The socket already listens, so connections
    made in the moment before uvicorn accepts are queued by the kernel.
    """
    server = asyncio.create_task(
        mcp.run_http_async(
            show_banner=False,
            host=host,
            port=sock.getsockname()[1],
            log_level="warning",
            path="/mcp",
            stateless_http=True,
            sockets=[sock],
        )
    )
    started = asyncio.create_task(mcp._started.wait())
    await asyncio.wait({server, started}, return_when=asyncio.FIRST_COMPLETED)
    if started.done():
        announce(sock)
    else:
        started.cancel()
    await server


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(prog="python -m backends.report", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument("--replica", required=True, help="name reported by whoami")
    parser.add_argument("--host", default="127.0.0.1", help="loopback by default")
    parser.add_argument("--tasks-url", default="memory://", help="Docket backend URL")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one replica until SIGTERM or SIGINT."""
    args = parse_args(argv)
    if args.host in ("0.0.0.0", "::", ""):
        sys.exit("refusing to listen on all interfaces; pass a loopback --host")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)
    mcp = build_server(args.replica, args.tasks_url)
    with listen(args.host, args.port) as sock:
        asyncio.run(serve(mcp, sock, args.host))
    return 0


if __name__ == "__main__":
    sys.exit(main())
