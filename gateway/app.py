"""make_app(): wires configuration, sessions and stores into an aiohttp application."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import aiohttp
from aiohttp import web

from gateway.config import Config, StoreConfig, sqlite_path
from gateway.discovery import Catalog
from gateway.errors import StartupError
from gateway.guard import Guard
from gateway.handler import handle_post, method_not_allowed
from gateway.routing.replicas import Backend
from gateway.routing.table import RouteTable
from gateway.state import GATEWAY, Gateway
from gateway.store.base import StoreUnavailable, TaskRouteStore
from gateway.store.redis import RedisStore
from gateway.store.sqlite import SQLiteStore
from gateway.taskroutes import TaskRouter

log = logging.getLogger("taskgate")


def make_app(config: Config) -> web.Application:
    """An application serving `config.listen.path`; resources open and close with it."""
    # aiohttp's own body limit is a backstop; the handler answers 413 with a JSON-RPC body.
    app = web.Application(client_max_size=config.listen.max_body_bytes)
    app.cleanup_ctx.append(_gateway_ctx(config))
    path = config.listen.path
    app.router.add_post(path, handle_post)
    app.router.add_route("GET", path, method_not_allowed)
    app.router.add_route("DELETE", path, method_not_allowed)
    app.router.add_get("/healthz", _healthz)
    return app


def _gateway_ctx(config: Config) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=256, keepalive_timeout=30)
        # One pooled session per process; no cookies, since taskgate speaks for no one upstream.
        session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=True,
        )
        routes = RouteTable(config.routes)
        backends = {name: Backend.from_config(name, b) for name, b in config.backends.items()}
        catalog = Catalog(session, backends, routes, refresh_s=config.discovery.refresh_s)
        store = await open_store(config.store)
        tasks = TaskRouter(store, config.tasks, session, cache_size=config.store.cache_size)
        app[GATEWAY] = Gateway(
            config=config,
            routes=routes,
            backends=backends,
            guard=Guard(config.listen),
            session=session,
            catalog=catalog,
            tasks=tasks,
        )
        catalog.warm()
        try:
            yield
        finally:
            await catalog.close()
            await tasks.close()
            await store.close()
            await session.close()

    return ctx


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def open_store(config: StoreConfig) -> TaskRouteStore:
    """The configured task-route store."""
    if config.url.startswith("sqlite:"):
        sqlite = SQLiteStore(sqlite_path(config.url), timeout_s=config.timeout_s)
        await sqlite.open()
        return sqlite
    redis_store = RedisStore(
        config.url,
        timeout_s=config.timeout_s,
        wait_replicas=config.replicas_to_wait_for,
        wait_aof=config.durability == "wait_aof",
        wait_timeout_ms=config.wait_timeout_ms,
    )
    if config.durability == "wait_aof":
        await _require_waitaof(redis_store)
    return redis_store


async def _require_waitaof(store: RedisStore) -> None:
    """WAITAOF exists from Redis 7.2; without it every create would fail, so refuse to start."""
    try:
        version = await store.server_version()
    except StoreUnavailable:
        log.warning("the task store is not reachable yet; WAITAOF support is unchecked")
        return
    if version < (7, 2):
        await store.close()
        raise StartupError(
            "store.durability: wait_aof needs Redis >= 7.2 (WAITAOF); this server is "
            f"{'.'.join(map(str, version))}. Use wait_replicas, or appendfsync always on it."
        )
