"""gateway_state(): wires configuration, sessions and stores into the state one process shares
(the parts the configuration describes are gateway/pipeline/parts.py's)."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator

import aiohttp

from gateway.bridge.callers import CallerSessions
from gateway.bridge.task_input import TaskInput
from gateway.catalog.table import RouteTable
from gateway.config import Config
from gateway.legacy.door import FrontDoor
from gateway.limits.limiter import Limiter
from gateway.listen.hub import ListenHub
from gateway.observe.history import ConfigHistory, config_version
from gateway.observe.observer import Observer
from gateway.observe.tracer import Tracer, open_tracer
from gateway.pipeline.coordinator import Coordinator
from gateway.pipeline.guard import Guard
from gateway.pipeline.parts import (
    authenticator,
    backend_limits,
    build_backends,
    build_catalog,
    list_poll_s,
    relay_pool,
    static_keys,
)
from gateway.pipeline.state import Gateway
from gateway.store.redis_routes import RedisRouteStore
from gateway.store.sqlite_routes import SQLiteRouteStore
from gateway.tasks.made import MadeTasks
from gateway.tasks.routes import TaskRouter
from gateway.tasks.stores import open_store
from gateway.upstream.health import Health, Prober
from gateway.upstream.pool import Pool

log = logging.getLogger("taskgate")


@contextlib.asynccontextmanager
async def gateway_state(
    config: Config, *, history: ConfigHistory | None = None
) -> AsyncIterator[Gateway]:
    """Everything one process shares between requests, opened in order and closed in reverse
    when the block ends (after the listener has drained)."""
    async with contextlib.AsyncExitStack() as stack:
        # What can fail on bad configuration comes before anything that needs closing.
        backends = build_backends(config)
        keys = static_keys(config.auth)
        # StartupError when tracing is asked for without the otel extra. Closed last, so the
        # spans of the last requests are exported.
        tracer = open_tracer(config)
        if tracer is not None:
            stack.push_async_callback(tracer.close)
        session = _key_fetch_session()
        stack.push_async_callback(session.close)
        pool = relay_pool(config)
        stack.push_async_callback(pool.close)
        routes = RouteTable(config.routes)
        catalog = build_catalog(config, pool, backends, routes)
        store, tasks, made = await _task_routes(config, stack, pool)
        limits = limiter(config, store)
        tasks.counted = made.counted = limits.created  # a task created enters the quotas
        health = Health(config.health)
        listens = ListenHub(
            config.subscriptions, pool=pool, catalog=catalog, table=routes, tasks=tasks,
            made=made, backends=backends, health=health, list_poll_s=list_poll_s(config),
            limits=limits,
        )  # fmt: skip
        stack.push_async_callback(listens.close)
        gateway = Gateway(
            config=config,
            routes=routes,
            backends=backends,
            guard=Guard(config.listen),
            session=session,
            pool=pool,
            catalog=catalog,
            tasks=tasks,
            made=made,
            auth=authenticator(config.auth, session, keys),
            coordinator=Coordinator(
                config.listen.max_in_flight,
                backend_limits(config),
                tenant_share=config.tenant_share,
            ),
            limits=limits,
            health=health,
            listens=listens,
            observer=Observer(config.logging),
            history=history
            or ConfigHistory(config_version(config.model_dump_json().encode()), None),
            prober=Prober(pool, backends, health, config.health, catalog.eras.speaks_2025),
            callers=CallerSessions(pool, backends),
        )
        stack.push_async_callback(gateway.callers.close)
        gateway.coordinator.limit(limits.policy.concurrency)
        _start(gateway, stack, store, tracer)
        yield gateway


async def _task_routes(
    config: Config, stack: contextlib.AsyncExitStack, pool: Pool
) -> tuple[SQLiteRouteStore | RedisRouteStore, TaskRouter, MadeTasks]:
    """The task-route store, the router that records and resolves routes in it, and the
    tasks taskgate runs itself (on the same store)."""
    store = await open_store(config.store, max_in_flight=config.listen.max_in_flight)
    stack.push_async_callback(store.close)
    tasks = TaskRouter(
        store,
        config.tasks,
        pool,
        cache_size=config.store.cache_size,
        sharing=config.auth.task_sharing,
        task_input=TaskInput(pool, store.questions()),
    )
    stack.push_async_callback(tasks.close)
    return store, tasks, _made_tasks(config, stack, store)


def _made_tasks(
    config: Config, stack: contextlib.AsyncExitStack, store: SQLiteRouteStore | RedisRouteStore
) -> MadeTasks:
    """The tasks taskgate runs itself, on the route store's connection. Closed before the
    store: a task still running then (no drain ran, as in tests) fails, saying so."""
    made = MadeTasks(
        store.made(),
        config.tasks.made,
        sharing=config.auth.task_sharing,
        record_timeout_s=config.tasks.record_timeout_s,
        instance=f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}",
    )
    stack.push_async_callback(made.drain, 0.0)
    return made


def limiter(config: Config, store: SQLiteRouteStore | RedisRouteStore) -> Limiter:
    """The limits on the store's buckets (shared in Redis, in process with SQLite)."""
    limits = config.limits
    return Limiter(limits, config.principal_defaults(), store.limits(limits.max_tracked))


def _key_fetch_session() -> aiohttp.ClientSession:
    """The HTTP client of the one call taskgate makes to what is not a replica: the JWKS
    fetch (gateway/auth/jwks.py); no cookies. Every call to a replica, the relay's and
    taskgate's own, goes over the pool (gateway/upstream/pool.py)."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=16, keepalive_timeout=30)
    return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())


def _start(
    gateway: Gateway,
    stack: contextlib.AsyncExitStack,
    store: SQLiteRouteStore | RedisRouteStore,
    tracer: Tracer | None,
) -> None:
    """The front door of the 2025 era when it is on, the tracer, the prober and the
    catalogue's first fetch, with what closes them at the end."""
    config = gateway.config
    if config.legacy.enabled:
        gateway.legacy = FrontDoor(config.legacy, store.sessions(), gateway.pool, gateway.limits)
        stack.push_async_callback(gateway.legacy.close)
    # A reload replaces the catalogue and the prober: what is closed at the end is the one
    # running then, not the one built here.
    stack.push_async_callback(close_routing, gateway)
    stack.callback(gateway.observer.close)  # the request log's last lines, written
    gateway.observer.tracer = gateway.tasks.tracer = tracer  # None: tracing is off
    gateway.prober.start()
    if config.auth.mode == "none":
        log.warning("auth.mode is none: every caller is anonymous; for development only")
    gateway.catalog.warm()


async def close_routing(gateway: Gateway) -> None:
    """Stop the running prober and the catalogue's background refreshes."""
    await gateway.prober.stop()
    await gateway.catalog.close()
