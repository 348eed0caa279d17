"""The `pushing` demo backend: an `mcp` SDK MCPServer (2.3.0) that serves subscriptions/listen
itself, so taskgate can relay `notifications/resources/updated` over upstream listens.

Resources `notes://a` and `notes://b` and the template `notes://{name}`; the tool `touch(uri)`
publishes a resources/updated event for `uri` to this replica's listen streams (the SDK's
in-memory bus: an event is seen only by streams on the replica where it was published),
`whoami` names the replica and `listeners` counts the listen streams the replica holds.
Started as `python -m backends.pushing --port 0 --replica NAME`, it prints the same READY line
as backends/report.py once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from collections.abc import Sequence
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer

from backends.report import announce, listen, prepare_process

LISTEN_METHOD = "subscriptions/listen"


def build_server(replica: str) -> MCPServer:
    """One replica's MCPServer."""
    mcp = MCPServer(f"pushing-{replica}")

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

    return mcp


def _listen_handler(mcp: MCPServer) -> Any:
    """The SDK's ListenHandler serving subscriptions/listen (MCPServer registers one)."""
    handlers: dict[str, Any] = mcp._lowlevel_server._request_handlers
    return getattr(handlers.get(LISTEN_METHOD), "handler", None)


def listen_streams(mcp: MCPServer) -> int:
    """The open streams of the SDK's ListenHandler (its `_streams`: the SDK exposes no count)."""
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
