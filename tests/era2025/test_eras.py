"""How a replica's era is learned, against aiohttp replicas on loopback that answer as a modern
server, a 2025-era one and one of neither era do: what is asked, what is concluded, and that a
replica of neither era is not asked before every call."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from gateway.bridge.era import MODERN
from gateway.bridge.eras import Eras
from gateway.config import BackendConfig, HealthConfig
from gateway.upstream.health import Health, Prober
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend


class Replica:
    """A replica answering by `kind`: "modern" (server/discover), "2025" (initialize only,
    discover refused with 400 as the Python SDK 1.x refuses it), "broken" (500 to anything),
    "misplaced" (404 to anything: a URL with the wrong path)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.asked: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        message: dict[str, Any] = await request.json()
        method = message.get("method", "")
        self.asked.append(method)
        if self.kind == "broken":
            return web.Response(status=500, text="down for maintenance")
        if self.kind == "misplaced":
            return web.Response(status=404, text="not found")
        if method == "notifications/initialized":
            return web.Response(status=202)
        if self.kind == "modern" and method == "server/discover":
            result = {"resultType": "complete", "supportedVersions": [MODERN], "capabilities": {}}
            return _answer(message, result)
        if self.kind == "2025" and method == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}}
            return _answer(message, result, {"Mcp-Session-Id": "s-1"})
        error = {"code": -32600, "message": "Bad Request: Missing session ID"}
        body = orjson.dumps({"jsonrpc": "2.0", "id": None, "error": error})
        return web.Response(status=400, body=body, content_type="application/json")

    async def deleted(self, request: web.Request) -> web.Response:
        self.asked.append("DELETE")
        return web.Response(status=200)


def _answer(
    message: dict[str, Any], result: dict[str, Any], headers: dict[str, str] | None = None
) -> web.Response:
    body = orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})
    return web.Response(body=body, content_type="application/json", headers=headers)


@pytest.fixture
async def serve() -> AsyncIterator[Any]:
    runners: list[web.AppRunner] = []

    async def start(replica: Replica) -> Backend:
        app = web.Application()
        app.router.add_post("/mcp", replica.handle)
        app.router.add_delete("/mcp", replica.deleted)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/mcp"
        return Backend.from_config("b", BackendConfig(replicas=(url,)))

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("kind", "era", "asked"),
    [
        ("modern", MODERN, ["server/discover"]),
        ("2025", "2025-06-18", ["server/discover", "initialize", "notifications/initialized"]),
        ("broken", None, ["server/discover"]),
    ],
)
async def test_what_is_asked_and_concluded(
    serve: Any, pool: Pool, kind: str, era: str | None, asked: list[str]
) -> None:
    replica = Replica(kind)
    backend = await serve(replica)
    eras = Eras(pool, {"b": backend}, 2.0)
    (on,) = backend.replicas
    assert eras.unknown(backend, on)
    assert await eras.learn(backend, on) is (kind == "2025")
    assert eras.era_of(on) == era
    assert replica.asked == asked
    # Known, or asked in vain just now: the next call goes without asking.
    assert not eras.unknown(backend, on)
    await eras.close()
    assert replica.asked[len(asked) :] == (["DELETE"] if kind == "2025" else [])


async def test_a_configured_era_is_never_asked(serve: Any, pool: Pool) -> None:
    replica = Replica("2025")
    backend = await serve(replica)
    backend.era = "2025"
    eras = Eras(pool, {"b": backend}, 2.0)
    (on,) = backend.replicas
    assert not eras.unknown(backend, on)
    assert eras.speaks_2025(backend, on)
    assert eras.described(backend, on) == "2025 (configured), not reached yet"
    assert replica.asked == []


@pytest.mark.parametrize(("kind", "healthy"), [("2025", True), ("misplaced", False)])
async def test_the_prober_takes_a_refusal_as_alive_only_from_a_2025_server(
    serve: Any, pool: Pool, kind: str, healthy: bool
) -> None:
    """A 2025-era server refuses the probe's server/discover; a replica that refuses it
    without being one (a wrong path) is ejected as before."""
    backend = await serve(Replica(kind))
    eras = Eras(pool, {"b": backend}, 2.0)
    (on,) = backend.replicas
    await eras.learn(backend, on)
    health = Health(HealthConfig())
    prober = Prober(pool, {"b": backend}, health, HealthConfig(), eras.speaks_2025)
    for _ in range(HealthConfig().unhealthy_after):
        await prober.probe_all()
    assert health.healthy(on) is healthy
    await eras.close()
