"""Opening the configured task-route store (and with it the 2025-era session store on the same
connection: its `sessions()`), for the process and for `taskgate task inspect`."""

from __future__ import annotations

import logging

from gateway.config import StoreConfig, sqlite_path
from gateway.errors import StartupError, StoreUnavailable
from gateway.store.redis_client import TLSFiles, default_max_connections
from gateway.store.redis_routes import RedisRouteStore
from gateway.store.sqlite_routes import SQLiteRouteStore

log = logging.getLogger("taskgate")


async def open_store(
    config: StoreConfig, *, max_in_flight: int | None = None
) -> SQLiteRouteStore | RedisRouteStore:
    """The configured task-route store (its `sessions()`, the 2025-era session store on the
    same connection). A Redis that does not answer yet is logged, not fatal: taskgate serves
    (creates fail closed, /readyz says why) and keeps trying. A Redis store's pool is
    store.max_connections, by default sized from `max_in_flight` (listen.max_in_flight); a
    command that makes one call at a time leaves it None: the smallest pool."""
    if config.url.startswith("sqlite:"):
        path = sqlite_path(config.url)
        if path == ":memory:":
            log.warning("store.url names an in-memory SQLite database: routes die with the process")
        sqlite = SQLiteRouteStore(path, timeout_s=config.timeout_s)
        await sqlite.open()
        return sqlite
    tls = None
    if config.tls is not None:
        tls = TLSFiles(config.tls.ca_file, config.tls.cert_file, config.tls.key_file)
        try:
            tls.check()
        except ValueError as unusable:
            raise StartupError(f"store.tls.{unusable}") from None
    redis_store = RedisRouteStore(
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


async def _require_waitaof(store: RedisRouteStore) -> None:
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
