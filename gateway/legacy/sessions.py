"""The client's 2025-era session: opened at initialize, found again on every later request by
its id and its caller, kept alive while used, ended by DELETE, by idleness, or when an upstream
session it relies on is gone."""

from __future__ import annotations

import secrets
from collections import Counter
from typing import Any

import orjson

from gateway.auth import Principal
from gateway.config import LegacyConfig
from gateway.errors import GatewayError, HTTPRefusal, Retryable
from gateway.protocol.codes import Code, RequestId
from gateway.store.base import now_ms
from gateway.store.sessions import LegacySession, Opened, SessionStore, owner_key

# A session's idle expiry is written again once a quarter of it has passed, not on every
# request: a busy session costs one store write per quarter of session_idle_s.
_TOUCH_FRACTION = 4


class SessionMissing(HTTPRefusal):
    """A 2025-era request other than initialize without Mcp-Session-Id (the revision's 400)."""

    status = 400

    def __init__(self, request_id: RequestId | None = None) -> None:
        super().__init__(
            "Bad Request: Mcp-Session-Id header is required (send initialize first)",
            request_id=request_id,
        )


class SessionNotFound(GatewayError):
    """Unknown, ended, expired, another caller's, or an upstream session it relied on is gone:
    one answer for all (the revision's 404), so that an id alone reveals nothing; the client
    initializes again."""

    status = 404
    code = Code.INVALID_REQUEST

    def __init__(self, request_id: RequestId | None = None) -> None:
        super().__init__("Session not found", request_id=request_id)


class Sessions:
    """Open, find, keep alive and end 2025-era sessions in the shared store."""

    def __init__(self, store: SessionStore, config: LegacyConfig) -> None:
        self._store = store
        self._config = config
        # opened, evicted, ended (DELETE), lost (an upstream session was gone): for /metrics
        self.events: Counter[str] = Counter()

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
        to make room for it (at max_sessions_per_principal: 2025-era clients seldom send
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
            max_per_owner=config.max_sessions_per_principal,
            max_total=config.max_sessions,
        )
        if opening.outcome is Opened.STORE_FULL:
            raise Retryable(
                "Too many sessions on taskgate; retry later", request_id=request_id, retry_after_s=5
            )
        self.events["opened"] += 1
        self.events["evicted"] += len(opening.evicted)
        return session, opening.evicted

    async def find(
        self, session_id: str | None, principal: Principal, request_id: RequestId | None
    ) -> LegacySession:
        """The caller's live session named by the header, its idle expiry moved when due."""
        if session_id is None:
            raise SessionMissing(request_id)
        owner = owner_key(principal.tenant, principal.subject)
        session = await self._store.session(session_id, owner)
        if session is None:
            raise SessionNotFound(request_id)
        now = now_ms()
        idle_ms = self._idle_ms
        due = session.expires_at_ms - now < idle_ms - idle_ms // _TOUCH_FRACTION
        if due and not await self._store.touch_session(session_id, owner, now + idle_ms):
            raise SessionNotFound(request_id)  # ended meanwhile, elsewhere
        return session

    async def end(self, session: LegacySession) -> LegacySession | None:
        """Remove `session`; what it was, or None when it was already gone."""
        return await self._store.end_session(session.session_id, session.owner)

    @property
    def _idle_ms(self) -> int:
        return int(self._config.session_idle_s * 1000)


def client_declared(session: LegacySession) -> dict[str, Any]:
    """The capabilities and clientInfo the client declared at initialize."""
    value = orjson.loads(session.client)
    return value if isinstance(value, dict) else {}
