"""taskgate in-process on a loopback port, configured from plain dicts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from gateway.config import Config
from gateway.h1.server import Server
from gateway.pipeline.state import Gateway
from gateway.process.serve import running
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
    admin_url: str | None = None  # the admin listener, when the configuration has one

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
    """Serve `config` on 127.0.0.1 with the wiring `taskgate run` uses (gateway/process/serve.py:
    its limits, handlers cancelled on disconnect, the admin listener when configured), on a free
    port; on leaving, in-flight requests are not waited for."""
    async with running(config, drain_timeout_s=0) as process:
        yield RunningGateway(
            url=process.url, state=process.state, server=process.server, admin_url=process.admin_url
        )


@asynccontextmanager
async def running_gateway(config: Config) -> AsyncIterator[str]:
    """Serve `config` and yield only its URL."""
    async with serving(config) as gateway:
        yield gateway.url
