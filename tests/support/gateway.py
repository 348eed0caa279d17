"""taskgate in-process on a loopback port, configured from plain dicts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp.test_utils import TestServer

from gateway.app import make_app
from gateway.config import Config


def gateway_config(
    backends: dict[str, list[str]],
    routes: list[tuple[list[str], str]],
    *,
    listen: dict[str, Any] | None = None,
    store: str = "sqlite:///:memory:",
    **sections: Any,
) -> Config:
    """A validated Config: `backends` name -> replica URLs, `routes` (tools, backend) pairs.

    The store defaults to an in-memory SQLite database, private to the gateway instance.
    """
    return Config.model_validate(
        {
            "listen": {"host": "127.0.0.1", "port": 0, **(listen or {})},
            "store": {"url": store},
            "backends": {name: {"replicas": urls} for name, urls in backends.items()},
            "routes": [{"tools": tools, "backend": backend} for tools, backend in routes],
            **sections,
        }
    )


@asynccontextmanager
async def running_gateway(config: Config) -> AsyncIterator[str]:
    """Serve `config` on 127.0.0.1 (handlers cancelled on disconnect, as in production)."""
    server = TestServer(make_app(config), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url(config.listen.path))
    finally:
        await server.close()
