"""taskgate in-process on a loopback port, configured from plain dicts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from gateway.app import gateway_state
from gateway.config import Config
from gateway.h1.server import Server
from gateway.listener import public_server
from gateway.state import Gateway
from gateway.store.base import now_ms


def gateway_config(
    backends: dict[str, list[str]],
    routes: list[tuple[list[str], str] | dict[str, Any]],
    *,
    listen: dict[str, Any] | None = None,
    store: str = "sqlite:///:memory:",
    backend_options: dict[str, dict[str, Any]] | None = None,
    **sections: Any,
) -> Config:
    """A validated Config: `backends` name -> replica URLs, `routes` (tools, backend) pairs or
    route mappings as the YAML has them (prompts, resources, tenants, scopes...).

    The store defaults to an in-memory SQLite database, private to the gateway instance.
    """
    return Config.model_validate(
        {
            "listen": {"host": "127.0.0.1", "port": 0, **(listen or {})},
            "store": {"url": store},
            "backends": {
                name: {"replicas": urls, **(backend_options or {}).get(name, {})}
                for name, urls in backends.items()
            },
            "routes": [
                route if isinstance(route, dict) else {"tools": route[0], "backend": route[1]}
                for route in routes
            ],
            **sections,
        }
    )


@dataclass(frozen=True)
class RunningGateway:
    url: str
    state: Gateway  # the process state (store, catalogue, ...), for tests behind the wire
    server: Server  # the listener's server (its connections, the request bytes it holds)

    async def expire_route(self, task_id: str) -> None:
        """What the passing of a route's lifetime does: it is gone from store and cache."""
        tasks = self.state.tasks
        route = await tasks.store.lookup(task_id)
        assert route is not None, "only a live route can expire"
        past = now_ms() - 1
        await tasks.store.refresh_expiry(task_id, route.ttl_ms, past)
        tasks.cache.moved(route, route.ttl_ms, past)


@asynccontextmanager
async def serving(config: Config) -> AsyncIterator[RunningGateway]:
    """Serve `config` on 127.0.0.1 with the server `taskgate run` uses (its limits, handlers
    cancelled on disconnect), on a free port."""
    async with gateway_state(config) as state:
        server = public_server(config, state)
        listener = await asyncio.get_running_loop().create_server(server, "127.0.0.1", 0)
        try:
            port = listener.sockets[0].getsockname()[1]
            url = f"http://127.0.0.1:{port}{config.listen.path}"
            yield RunningGateway(url=url, state=state, server=server)
        finally:
            listener.close()
            state.listens.drain()  # as `taskgate run` does on SIGTERM
            await server.shutdown(0)


@asynccontextmanager
async def running_gateway(config: Config) -> AsyncIterator[str]:
    """Serve `config` and yield only its URL."""
    async with serving(config) as gateway:
        yield gateway.url
