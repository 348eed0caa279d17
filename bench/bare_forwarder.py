"""A bare aiohttp forwarder: the least an aiohttp proxy does, as a reference for taskgate.

    python -m bench.bare_forwarder --port N --upstream http://127.0.0.1:M/mcp [--workers 1]

Every POST, whatever its path, is forwarded to the one upstream URL through one pooled
aiohttp.ClientSession (keep-alive, no connection limit) with its body and Content-Type; the
upstream's status, body and Content-Type are relayed. Nothing else: no parsing, no checks, no
other headers. With --workers N > 1, N processes share the port (SO_REUSEPORT, as taskgate's
workers do), each with its own session; the parent only waits for SIGTERM and stops them.
"""

from __future__ import annotations

import argparse
import os
import signal
import traceback
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

UPSTREAM = web.AppKey("upstream", str)
SESSION = web.AppKey("session", aiohttp.ClientSession)


def make_app(upstream: str) -> web.Application:
    app = web.Application()
    app[UPSTREAM] = upstream
    app.cleanup_ctx.append(_session)
    app.router.add_post("/{path:.*}", forward)
    return app


async def _session(app: web.Application) -> AsyncIterator[None]:
    connector = aiohttp.TCPConnector(limit=0)  # keep-alive (the default), no limit
    async with aiohttp.ClientSession(connector=connector) as session:
        app[SESSION] = session
        yield


async def forward(request: web.Request) -> web.Response:
    body = await request.read()
    headers = {"Content-Type": request.headers.get("Content-Type", "application/octet-stream")}
    app = request.app
    async with app[SESSION].post(app[UPSTREAM], data=body, headers=headers) as upstream:
        answer = await upstream.read()
        relayed = {}
        if "Content-Type" in upstream.headers:
            relayed["Content-Type"] = upstream.headers["Content-Type"]
        return web.Response(status=upstream.status, body=answer, headers=relayed)


def serve(port: int, upstream: str, reuse_port: bool) -> None:
    web.run_app(
        make_app(upstream),
        host="127.0.0.1",
        port=port,
        reuse_port=reuse_port,
        print=None,
        access_log=None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="a bare aiohttp forwarder on loopback")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the one URL every POST goes to")
    parser.add_argument("--workers", type=int, default=1, help="processes sharing the port")
    args = parser.parse_args()
    if args.workers <= 1:
        serve(args.port, args.upstream, reuse_port=False)
        return
    stopping = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stopping)  # until sigwait, below
    children = []
    for _ in range(args.workers):
        pid = os.fork()
        if pid == 0:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stopping)
            code = 0
            try:
                serve(args.port, args.upstream, reuse_port=True)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
    signal.sigwait(stopping)
    for pid in children:
        os.kill(pid, signal.SIGTERM)
    for pid in children:
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
