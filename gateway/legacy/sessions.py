"""The client's 2025-era session: opened at initialize, found again on every later request by
its id and its caller, kept alive while used, ended by DELETE, by idleness, or when an upstream
session it relies on is gone."""

from __future__ import annotations

import secrets
import time
from collections import Counter, OrderedDict
from dataclasses import replace
from typing import Any

import orjson

from gateway.auth import Principal
from gateway.config import LegacyConfig
from gateway.errors import HTTPRefusal, Retryable, SessionMissing, SessionNotFound
from gateway.limits.limiter import Limiter
from gateway.protocol.codes import RequestId
from gateway.store.base import now_ms
from gateway.store.sessions import LegacySession, OpenOutcome, SessionStore, owner_key

# A session's idle expiry is written again once a quarter of it has passed, not on every
# request: a busy session costs one store write per quarter of session_idle_s.
_TOUCH_FRACTION = 4
# Sessions one process keeps from its last store read (find()): about 1 KB each at most
# (max_client_bytes aside), so a few MB; past it the least recently kept go first.
_KEPT_SESSIONS = 10_000


class Sessions:
    """Open, find, keep alive and end 2025-era sessions in the shared store."""

    def __init__(self, store: SessionStore, config: LegacyConfig, limits: Limiter) -> None:
        self._store = store
        self._config = config
        self._limits = limits  # limits.principal.sessions, per tenant
        # opened, evicted, ended (DELETE), lost (an upstream session was gone): for /metrics
        self.events: Counter[str] = Counter()
        # (id, owner) -> (kept until, monotonic; the session as last seen): see find()
        self._recent: OrderedDict[tuple[str, str], tuple[float, LegacySession]] = OrderedDict()

    @property
    def store(self) -> SessionStore:
        return self._store

    def reconfigure(self, config: LegacyConfig) -> None:
        self._config = config

    async def open(
        self,
        principal: Principal,
        version: str,
        client: dict[str, Any],
        request_id: RequestId,
    ) -> tuple[LegacySession, tuple[LegacySession, ...]]:
        """A new session for `principal`, and the caller's least recently used sessions ended
        to make room for it (at limits.principal.sessions: 2025-era clients seldom send
        DELETE, so a caller who reconnects often would otherwise lock itself out); the store's
        retryable error when it holds max_sessions."""
        config = self._config
        declared = orjson.dumps(client)
        if len(declared) > config.max_client_bytes:
            raise HTTPRefusal(
                f"Invalid request: the client's capabilities and clientInfo take {len(declared)} "
                f"bytes as JSON; taskgate keeps at most {config.max_client_bytes}",
                request_id=request_id,
                status=400,
            )
        created = now_ms()
        session = LegacySession(
            session_id=secrets.token_urlsafe(24),  # 192 bits, visible ASCII as the revision asks
            owner=owner_key(principal.tenant, principal.subject),
            tenant=principal.tenant,
            principal=principal.subject,
            protocol_version=version,
            client=declared,
            created_at_ms=created,
            expires_at_ms=created + self._idle_ms,
        )
        opening = await self._store.open_session(
            session,
            max_per_owner=self._limits.policy.of(principal.tenant).principal.sessions
            or config.max_sessions,
            max_total=config.max_sessions,
        )
        if opening.outcome is OpenOutcome.STORE_FULL:
            raise Retryable(
                "Too many sessions on taskgate; retry later", request_id=request_id, retry_after_s=5
            )
        self.events["opened"] += 1
        self.events["evicted"] += len(opening.evicted)
        return session, opening.evicted

    async def find(
        self,
        session_id: str | None,
        principal: Principal,
        request_id: RequestId | None,
        *,
        fresh: bool = False,
    ) -> LegacySession:
        """The caller's live session named by the header, its idle expiry moved when due.

        A session found in the store is kept here for `session_cache_s` (keyed by id and
        owner, so another caller's token never finds it), for the requests that may use it
        (not `fresh`: relayed calls, gateway/pipeline/legacy.py). A session ended or evicted by
        another instance had its upstream sessions ended first, so a call relayed on this
        copy gets the backend's 404, which ends it here too; an upstream session bound by
        another instance meanwhile is learnt from the store when this one binds its own
        (gateway/legacy/upstreams.py)."""
        if session_id is None:
            raise SessionMissing(request_id)
        owner = owner_key(principal.tenant, principal.subject)
        key = (session_id, owner)
        now = now_ms()
        kept = None if fresh else self._recent.get(key)
        if kept is not None and kept[0] > time.monotonic() and kept[1].expires_at_ms > now:
            session = kept[1]
        else:
            found = await self._store.session(session_id, owner)
            if found is None:
                self._recent.pop(key, None)
                raise SessionNotFound(request_id)
            session = found
            self.remember(session)
        idle_ms = self._idle_ms
        if session.expires_at_ms - now < idle_ms - idle_ms // _TOUCH_FRACTION:
            if not await self._store.touch_session(session_id, owner, now + idle_ms):
                self._recent.pop(key, None)
                raise SessionNotFound(request_id)  # ended meanwhile, elsewhere
            session = replace(session, expires_at_ms=now + idle_ms)
            self.remember(session)
        return session

    def remember(self, session: LegacySession) -> None:
        """Keep `session` as this instance last saw it, for session_cache_s (bounded: the
        least recently kept go first)."""
        keep_s = self._config.session_cache_s
        if keep_s <= 0:
            return
        key = (session.session_id, session.owner)
        self._recent.pop(key, None)
        self._recent[key] = (time.monotonic() + keep_s, session)
        while len(self._recent) > _KEPT_SESSIONS:
            self._recent.popitem(last=False)

    async def set_log_level(
        self, session: LegacySession, level: str, request_id: RequestId
    ) -> LegacySession:
        """Keep the client's logging level with its session; the session as it is now.
        SessionNotFound when it ended meanwhile."""
        if not await self._store.set_log_level(session.session_id, session.owner, level):
            self._recent.pop((session.session_id, session.owner), None)
            raise SessionNotFound(request_id)
        updated = replace(session, log_level=level)
        self.remember(updated)
        return updated

    async def end(self, session: LegacySession) -> LegacySession | None:
        """Remove `session`; what it was, or None when it was already gone."""
        self._recent.pop((session.session_id, session.owner), None)
        return await self._store.end_session(session.session_id, session.owner)

    @property
    def _idle_ms(self) -> int:
        return int(self._config.session_idle_s * 1000)


def client_declared(session: LegacySession) -> dict[str, Any]:
    """The capabilities and clientInfo the client declared at initialize."""
    value = orjson.loads(session.client)
    return value if isinstance(value, dict) else {}
