"""gateway_state(): wires configuration, sessions and stores into the state one process shares."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import aiohttp

from gateway.auth import keys, metadata
from gateway.auth.authenticator import Anonymous, Authenticator, JWTAuthenticator, KeySource
from gateway.auth.jwks import JWKSource, StaticKeys
from gateway.auth.keys import VerificationKey
from gateway.auth.verify import Rules
from gateway.catalog.discovery import Catalog
from gateway.catalog.table import RouteTable
from gateway.config import AuthConfig, Config, StoreConfig, sqlite_path
from gateway.errors import StartupError, StoreUnavailable
from gateway.h1.answers import AnswerBudget
from gateway.legacy.door import FrontDoor
from gateway.listen.hub import ListenHub
from gateway.observe.history import ConfigHistory, config_version
from gateway.observe.observer import Observer
from gateway.observe.trace import open_tracer
from gateway.pipeline.coordinator import Coordinator
from gateway.pipeline.guard import Guard
from gateway.pipeline.state import Gateway
from gateway.store.redis import RedisStore
from gateway.store.redis_client import TLSFiles, default_max_connections
from gateway.store.sqlite import SQLiteStore
from gateway.tasks.routes import TaskRouter
from gateway.upstream.connection import HeadLimits
from gateway.upstream.health import Health, Prober
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend

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
        static_keys = _static_keys(config.auth)
        # StartupError when tracing is asked for without the otel extra. Closed last, so the
        # spans of the last requests are exported.
        tracer = open_tracer(config)
        if tracer is not None:
            stack.push_async_callback(tracer.close)
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=256, keepalive_timeout=30)
        # One pooled session per process for taskgate's own calls; no cookies: taskgate
        # speaks for no one upstream. The relay has its own connections (gateway/h1).
        session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=True
        )
        stack.push_async_callback(session.close)
        pool = relay_pool(config)
        stack.push_async_callback(pool.close)
        routes = RouteTable(config.routes)
        catalog = build_catalog(config, session, backends, routes)
        store = await open_store(config.store, max_in_flight=config.listen.max_in_flight)
        stack.push_async_callback(store.close)
        tasks = TaskRouter(
            store,
            config.tasks,
            session,
            cache_size=config.store.cache_size,
            sharing=config.auth.task_sharing,
        )
        stack.push_async_callback(tasks.close)
        health = Health(config.health)
        listens = ListenHub(
            config.subscriptions,
            session=session,
            catalog=catalog,
            table=routes,
            tasks=tasks,
            backends=backends,
            health=health,
            list_poll_s=list_poll_s(config),
        )
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
            auth=_authenticator(config.auth, session, static_keys),
            coordinator=Coordinator(
                config.listen.max_in_flight,
                backend_limits(config),
                tenant_share=config.tenant_share,
            ),
            health=health,
            listens=listens,
            observer=Observer(config.logging),
            history=history
            or ConfigHistory(config_version(config.model_dump_json().encode()), None),
            prober=Prober(session, backends, health, config.health),
        )
        if config.legacy.enabled:
            gateway.legacy = FrontDoor(config.legacy, store, session)
            stack.push_async_callback(gateway.legacy.close)
        # A reload replaces the catalogue and the prober: what is closed at the end is the
        # one running then, not the one built here.
        stack.push_async_callback(close_routing, gateway)
        stack.callback(gateway.observer.close)  # the request log's last lines, written
        gateway.observer.tracer = tasks.tracer = tracer  # None: tracing is off
        gateway.prober.start()
        if config.auth.mode == "none":
            log.warning("auth.mode is none: every caller is anonymous; for development only")
        catalog.warm()
        yield gateway


async def close_routing(gateway: Gateway) -> None:
    """Stop the running prober and the catalogue's background refreshes."""
    await gateway.prober.stop()
    await gateway.catalog.close()


def build_backends(config: Config) -> dict[str, Backend]:
    """The backends and their replicas; reads each upstream credential (StartupError)."""
    return {name: Backend.from_config(name, b) for name, b in config.backends.items()}


def build_catalog(
    config: Config,
    session: aiohttp.ClientSession,
    backends: dict[str, Backend],
    routes: RouteTable,
) -> Catalog:
    """The catalogue of what `backends` serve through `routes`; nothing fetched yet."""
    return Catalog(
        session,
        backends,
        routes,
        refresh_s=config.discovery.refresh_s,
        page_size=config.discovery.page_size,
    )


def build_authenticator(auth: AuthConfig, session: aiohttp.ClientSession) -> Authenticator:
    """The authenticator `auth` describes; reads its static keys (StartupError)."""
    return _authenticator(auth, session, _static_keys(auth))


def backend_limits(config: Config) -> dict[str, int]:
    """Calls at once per backend, for the coordinator."""
    return {name: b.max_in_flight for name, b in config.backends.items()}


def list_poll_s(config: Config) -> float:
    """How often list_changed compares the catalogue while a stream asks for it."""
    return config.subscriptions.list_poll_s or config.discovery.refresh_s


def relay_pool(config: Config) -> Pool:
    """The relay's connections, bounding each replica's answer head by its backend's limits,
    by default the listener's own, and the answer bytes held for clients by the process's
    budget (listen.max_answer_buffer_bytes)."""
    listen = config.listen
    answers = AnswerBudget(listen.max_answer_buffer_bytes, listen.max_connections)
    pool = Pool(limits=default_head_limits(config), answers=answers)
    for url, limits in replica_head_limits(config).items():
        pool.limit(url, limits)
    return pool


def default_head_limits(config: Config) -> HeadLimits:
    """A replica's answer head is bounded as a client's request head, unless its backend says
    otherwise."""
    listen = config.listen
    return HeadLimits(listen.max_header_bytes, listen.max_headers, listen.max_head_bytes)


def replica_head_limits(config: Config) -> dict[str, HeadLimits]:
    """The replicas whose backend bounds their answer heads otherwise than the listener."""
    listen = config.listen
    found: dict[str, HeadLimits] = {}
    for backend in config.backends.values():
        if backend.max_header_bytes is None and backend.max_headers is None:
            continue
        limits = HeadLimits(
            backend.max_header_bytes or listen.max_header_bytes,
            backend.max_headers or listen.max_headers,
            listen.max_head_bytes,
        )
        for url in backend.replicas:
            found[url] = limits
    return found


def _static_keys(auth: AuthConfig) -> tuple[VerificationKey, ...]:
    try:
        return tuple(
            keys.from_secret_env(k.kid, k.secret_env)
            if k.secret_env is not None
            else keys.from_pem(k.kid, k.alg, k.file or "")
            for k in auth.keys
        )
    except keys.UnusableKey as exc:
        raise StartupError(f"auth.keys: {exc}") from None


def _authenticator(
    auth: AuthConfig, session: aiohttp.ClientSession, static_keys: tuple[VerificationKey, ...]
) -> Authenticator:
    if auth.mode == "none":
        return Anonymous()
    assert auth.issuer is not None  # both checked with the configuration
    assert auth.audience is not None
    rules = Rules(
        issuer=auth.issuer,
        audience=auth.audience,
        algorithms=frozenset(auth.algorithms),
        tenant_claim=auth.tenant_claim,
        principal_claim=auth.principal_claim,
        leeway_s=auth.leeway_s,
    )
    source: KeySource
    if auth.jwks_url is not None:
        source = JWKSource(
            session,
            auth.jwks_url,
            refresh_s=auth.jwks_refresh_s,
            min_refresh_s=auth.jwks_min_refresh_s,
        )
    else:
        source = StaticKeys(static_keys)
    return JWTAuthenticator(
        rules, source, metadata.metadata_url(auth), cache_size=auth.token_cache_size
    )


async def open_store(
    config: StoreConfig, *, max_in_flight: int | None = None
) -> SQLiteStore | RedisStore:
    """The configured task-route store. A Redis that does not answer yet is logged, not fatal:
    taskgate serves (creates fail closed, /readyz says why) and keeps trying. A Redis store's
    pool is store.max_connections, by default sized from `max_in_flight`
    (listen.max_in_flight); a command that makes one call at a time leaves it None: the
    smallest pool."""
    if config.url.startswith("sqlite:"):
        path = sqlite_path(config.url)
        if path == ":memory:":
            log.warning("store.url names an in-memory SQLite database: routes die with the process")
        sqlite = SQLiteStore(path, timeout_s=config.timeout_s)
        await sqlite.open()
        return sqlite
    tls = None
    if config.tls is not None:
        tls = TLSFiles(config.tls.ca_file, config.tls.cert_file, config.tls.key_file)
        try:
            tls.check()
        except ValueError as unusable:
            raise StartupError(f"store.tls.{unusable}") from None
    redis_store = RedisStore(
        config.url,
        tls=tls,
        timeout_s=config.timeout_s,
        wait_replicas=config.replicas_to_wait_for,
        wait_aof=config.durability == "wait_aof",
        wait_timeout_ms=config.wait_timeout_ms,
        max_connections=config.max_connections or default_max_connections(max_in_flight or 1),
    )
    try:
        await redis_store.ping()
    except StoreUnavailable as unreachable:
        unchecked = "; WAITAOF support is unchecked" if config.durability == "wait_aof" else ""
        said = str(unreachable).removesuffix("; retry")
        log.warning("%s; taskgate starts and keeps trying%s", said, unchecked)
        return redis_store
    if config.durability == "wait_aof":
        await _require_waitaof(redis_store)
    return redis_store


async def _require_waitaof(store: RedisStore) -> None:
    """WAITAOF exists from Redis 7.2 and answers only a server with its AOF on; without either
    every create would fail, so refuse to start. On a cluster every master must have both: the
    oldest one's version counts, and each one's AOF."""
    try:
        version = await store.server_version()
        without_aof = await store.without_aof() if version >= (7, 2) else []
    except StoreUnavailable as exc:
        log.warning("%s; WAITAOF support is unchecked", str(exc).removesuffix("; retry"))
        return
    if version < (7, 2):
        await store.close()
        raise StartupError(
            "store.durability: wait_aof needs Redis >= 7.2 (WAITAOF); this server is "
            f"{'.'.join(map(str, version))}. Use wait_replicas, or appendfsync always on it."
        )
    if without_aof:
        await store.close()
        named = [name for name in without_aof if name]
        which = (
            f"the cluster's master{'s' if len(named) > 1 else ''} {', '.join(named)}"
            if named
            else "this server"
        )
        raise StartupError(
            "store.durability: wait_aof needs appendonly yes on the server (WAITAOF waits for "
            f"its AOF fsync); {which} {'have' if len(named) > 1 else 'has'} appendonly no "
            "(INFO persistence: aof_enabled:0). Turn appendonly yes on, or use wait_replicas."
        )
