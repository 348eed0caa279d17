"""A reverse proxy on loopback that sends each request to the next of N upstreams in turn.

Per request, not per connection: a client that keeps one connection open still has its
consecutive requests served by different upstreams, as behind a load balancer without session
affinity. That is how one client spreads its session over two taskgate instances.

Requests go upstream as they came (method, path and query, headers bar hop-by-hop ones, body);
answers come back as they come, streamed chunk by chunk, so that an SSE stream is relayed
event by event rather than when it ends. A client that goes away has its upstream request
dropped with it (the handler is cancelled, which closes the upstream response).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from tests.support.procs import LOOPBACK

# RFC 9110 7.6.1's connection-specific fields, plus what aiohttp sets itself for each hop: Host
# (the upstream's), Content-Length and Transfer-Encoding (the framing of each hop's body).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
# aiohttp's client adds these when a request has none; the proxy must not invent headers the
# client did not send.
AUTO_HEADERS = ("User-Agent", "Accept-Encoding", "Content-Type")
# Bounds the wait for in-flight answers at shutdown; the upstream session is closed first, so
# each one ends at once and this is only a backstop.
SHUTDOWN_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Exchange:
    """One request as the proxy received it, the upstream it went to (its index) and the status
    that upstream answered (None when it could not be reached: the client got a 502)."""

    method: str
    path_qs: str
    headers: CIMultiDictProxy[str]
    body: bytes
    upstream: int
    status: int | None


@dataclass
class RoundRobin:
    """The running proxy: its base URL and every exchange so far, in arrival order."""

    url: str
    upstreams: tuple[str, ...]
    exchanges: list[Exchange] = field(default_factory=list)

    def url_for(self, path: str) -> str:
        """The proxy's URL for `path`, e.g. url_for("/mcp")."""
        return f"{self.url}{path}"


def _forwardable(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """`headers` without the hop-by-hop ones, including any the Connection header names."""
    named = {
        token.strip().lower()
        for value in headers.getall("Connection", [])
        for token in value.split(",")
    }
    return CIMultiDict(
        (name, value)
        for name, value in headers.items()
        if name.lower() not in HOP_BY_HOP and name.lower() not in named
    )


def _origin(url: str) -> str:
    """A base URL without its trailing slash: the request's path is appended to it."""
    return url.rstrip("/")


@asynccontextmanager
async def round_robin(upstreams: Iterable[str]) -> AsyncIterator[RoundRobin]:
    """Serve on a free loopback port until the block ends; request k goes to upstream k mod N.

    `upstreams` are base URLs (scheme, host, port, optionally a path prefix): a request for
    /mcp?x=1 goes to <upstream>/mcp?x=1.
    """
    bases: Sequence[str] = tuple(_origin(url) for url in upstreams)
    if not bases:
        raise ValueError("round_robin needs at least one upstream")
    turn = itertools.cycle(range(len(bases)))
    proxy = RoundRobin(url="", upstreams=tuple(bases))
    # auto_decompress off: the body goes back byte for byte, with its Content-Encoding. No total
    # timeout: an SSE stream lasts as long as the client keeps it.
    session = aiohttp.ClientSession(
        auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
    )

    async def forward(request: web.Request) -> web.StreamResponse:
        index = next(turn)
        body = await request.read()
        headers = _forwardable(request.headers)
        skip = [name for name in AUTO_HEADERS if name not in headers]
        try:
            answer = await session.request(
                request.method,
                f"{bases[index]}{request.path_qs}",
                headers=headers,
                data=body or None,
                allow_redirects=False,
                skip_auto_headers=skip,
            )
        except aiohttp.ClientError as exc:
            proxy.exchanges.append(
                Exchange(request.method, request.path_qs, request.headers, body, index, None)
            )
            return web.Response(status=502, text=f"round_robin: upstream {index}: {exc}\n")
        async with answer:
            proxy.exchanges.append(
                Exchange(
                    request.method, request.path_qs, request.headers, body, index, answer.status
                )
            )
            response = web.StreamResponse(
                status=answer.status, reason=answer.reason, headers=_forwardable(answer.headers)
            )
            if answer.headers.get("Content-Length") is not None:
                response.content_length = int(answer.headers["Content-Length"])
            await response.prepare(request)
            try:
                # iter_any hands over whatever has arrived, so each SSE event is written on as
                # soon as the upstream sends it.
                async for chunk in answer.content.iter_any():
                    await response.write(chunk)
            except aiohttp.ClientError:
                # The upstream broke off (or the proxy is closing): the client sees its answer
                # end where the upstream's did.
                return response
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", forward)
    # handler_cancellation: a client that leaves (its GET stream closed, its call abandoned)
    # cancels the handler, which closes the upstream response, as a real proxy would.
    runner = web.AppRunner(
        app, handler_cancellation=True, shutdown_timeout=SHUTDOWN_TIMEOUT_S, access_log=None
    )
    try:
        await runner.setup()
        site = web.TCPSite(runner, LOOPBACK, 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        proxy.url = f"http://{host}:{port}"
        yield proxy
    finally:
        # The upstream connections first: any answer still streaming (an SSE stream the client
        # never closed) ends at once, so the server's shutdown has nothing to wait for.
        await session.close()
        await runner.cleanup()
