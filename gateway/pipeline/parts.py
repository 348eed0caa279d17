"""The parts of the process state that the configuration describes, built the same way when
the process starts (gateway/process/app.py) and when a reload replaces them
(gateway/ops/reload.py): backends, the catalogue, the authenticator, the relay's pool and its
limits."""

from __future__ import annotations

import aiohttp

from gateway.auth import keys, metadata
from gateway.auth.authenticator import Anonymous, Authenticator, JWTAuthenticator, KeySource
from gateway.auth.jwks import JWKSource, StaticKeys
from gateway.auth.keys import VerificationKey
from gateway.auth.verify import Rules
from gateway.catalog.discovery import Catalog
from gateway.catalog.table import RouteTable
from gateway.config import AuthConfig, Config
from gateway.errors import StartupError
from gateway.h1.answers import AnswerBudget
from gateway.upstream.framing import HeadLimits
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend


def build_backends(config: Config) -> dict[str, Backend]:
    """The backends and their replicas; reads each upstream credential (StartupError)."""
    return {name: Backend.from_config(name, b) for name, b in config.backends.items()}


def build_catalog(
    config: Config,
    pool: Pool,
    backends: dict[str, Backend],
    routes: RouteTable,
) -> Catalog:
    """The catalogue of what `backends` serve through `routes`; nothing fetched yet."""
    return Catalog(
        pool,
        backends,
        routes,
        refresh_s=config.discovery.refresh_s,
        page_size=config.discovery.page_size,
    )


def build_authenticator(auth: AuthConfig, session: aiohttp.ClientSession) -> Authenticator:
    """The authenticator `auth` describes; reads its static keys (StartupError)."""
    return authenticator(auth, session, static_keys(auth))


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


def static_keys(auth: AuthConfig) -> tuple[VerificationKey, ...]:
    """The keys `auth` lists, read now (StartupError naming the one that is unusable)."""
    try:
        return tuple(
            keys.from_secret_env(k.kid, k.secret_env)
            if k.secret_env is not None
            else keys.from_pem(k.kid, k.alg, k.file or "")
            for k in auth.keys
        )
    except keys.UnusableKey as exc:
        raise StartupError(f"auth.keys: {exc}") from None


def authenticator(
    auth: AuthConfig, session: aiohttp.ClientSession, static_keys: tuple[VerificationKey, ...]
) -> Authenticator:
    """Anonymous for auth.mode none; else the JWT verifier on the JWKS or the static keys."""
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
