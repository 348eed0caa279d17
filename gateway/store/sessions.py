"""Sessions of 2025-era clients (gateway/legacy): the record every taskgate instance reads, and
the store operations on it.

A 2025-era client holds one `Mcp-Session-Id` and may send its next request to any taskgate
instance, so the session lives in the route store, beside the task routes. The record is keyed
by its id *and* its owner (a hash of the verified tenant and principal): a lookup with another
caller's token misses, exactly as an unknown id does, so the id alone grants nothing.

The upstream sessions taskgate opens for it, one per backend and lazily, are fields of the
record of their own: two instances binding two backends at once never overwrite each other, and
the first to bind a backend is the one every instance uses (bind_upstream).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson


def owner_key(tenant: str, principal: str) -> str:
    """The session's binding to its caller: short, fixed-length, and no claim in clear in the
    store (a Redis hash tag, so that an owner's sessions and its count share one slot)."""
    # The tenant's length goes first: with a separator alone, a claim holding the separator
    # could make two different callers one owner ("a\0b", "c" and "a", "b\0c").
    tenant_bytes = tenant.encode()
    digest = hashlib.blake2b(len(tenant_bytes).to_bytes(8, "big"), digest_size=12)
    digest.update(tenant_bytes)
    digest.update(principal.encode())
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class UpstreamSession:
    """The 2025-era session taskgate opened on one replica of a backend for a client's session."""

    replica: str  # the replica's URL, as configured
    session_id: str  # the backend's own Mcp-Session-Id


@dataclass(frozen=True, slots=True)
class LegacySession:
    session_id: str  # taskgate's Mcp-Session-Id: random, visible ASCII
    owner: str  # owner_key(tenant, principal)
    tenant: str
    principal: str
    protocol_version: str  # negotiated at initialize: 2025-03-26, 2025-06-18 or 2025-11-25
    client: bytes  # JSON {"capabilities": ..., "clientInfo": ...} as the client declared them
    created_at_ms: int
    expires_at_ms: int  # idle expiry: moved forward while the client uses the session
    upstreams: Mapping[str, UpstreamSession] = field(default_factory=dict)  # by backend name
    # The client's logging/setLevel, "" until it sends one: kept beside the record, as the
    # upstreams are, since it changes (gateway/pipeline/legacy.py sends it upstream).
    log_level: str = ""


class OpenOutcome(enum.Enum):
    OPENED = "opened"
    STORE_FULL = "store_full"  # max_total live sessions in the store


@dataclass(frozen=True, slots=True)
class Opening:
    """What open_session did. A 2025-era client that never sends DELETE (the MCP Inspector CLI,
    editors) leaves its sessions to expire; refusing its caller at the owner limit would lock
    that caller out until they do, so the least recently used sessions make room instead."""

    outcome: OpenOutcome
    # The owner's sessions ended to make room, least recently used first, each with its
    # upstream sessions as they were: the caller ends those too. Empty unless the owner was at
    # its limit (more than one only when the limit was lowered since they were opened). A
    # record the store cannot read is ended all the same, but not returned.
    evicted: tuple[LegacySession, ...] = ()


class SessionStore(Protocol):
    """Shared, expiring 2025-era session records. Expired records are never returned."""

    async def open_session(
        self, session: LegacySession, *, max_per_owner: int, max_total: int
    ) -> Opening:
        """Insert `session` (its upstreams empty) unless the store holds `max_total` live
        sessions (STORE_FULL, nothing changed).

        An owner at `max_per_owner` (at least 1) is not refused: clients that never DELETE
        would otherwise lock their caller out until their sessions expire. Its least recently
        used live sessions (lowest expires_at_ms: every use moves the expiry forward) are ended
        in the same atomic step as the insert, as many as leave it `max_per_owner` with the new
        one, and returned. Only the owner's own sessions are ever ended, and the owner limit is
        exact; the total may be passed by the openings in flight at once on other instances
        (a cluster counts it apart from the owner's slot). Opening a live id again replaces it:
        it is neither counted nor evicted."""
        ...

    async def session(self, session_id: str, owner: str) -> LegacySession | None:
        """The live session `session_id` of `owner`, with its upstream sessions, or None."""
        ...

    async def bind_upstream(
        self, session_id: str, owner: str, backend: str, upstream: UpstreamSession
    ) -> UpstreamSession | None:
        """Record `upstream` as `backend`'s upstream session of a live session unless one is
        recorded already (first binder wins), and return the one recorded after the call: the
        one just written, or the one an earlier call wrote. None when the session is gone
        (ended or expired).

        First binder wins, in one atomic step that answers the winner: two instances (or two
        requests) opening an upstream session for the same backend at once must agree on one,
        without a re-read, even when one of them acts on a stale copy of the record. The caller
        whose `upstream` is not the one returned lost, and ends its own upstream session."""
        ...

    async def touch_session(self, session_id: str, owner: str, expires_at_ms: int) -> bool:
        """Move a live session's idle expiry; False when it is gone."""
        ...

    async def set_log_level(self, session_id: str, owner: str, level: str) -> bool:
        """Keep the client's logging level with a live session (the last one set wins);
        False when it is gone."""
        ...

    async def end_session(self, session_id: str, owner: str) -> LegacySession | None:
        """Remove the session and return it as it was (its upstreams, to end them too), or
        None when it was not live."""
        ...


def encode_record(session: LegacySession) -> bytes:
    """The fields of `session` that never change, as JSON. Its id and owner name the record in
    the store, and its expiry and upstream sessions change: each is kept beside it, on its own."""
    return orjson.dumps(
        {
            "tenant": session.tenant,
            "principal": session.principal,
            "protocol_version": session.protocol_version,
            # JSON is UTF-8 (RFC 8259): kept as text, readable where the store is inspected.
            "client": session.client.decode(),
            "created_at_ms": session.created_at_ms,
        }
    )


def encode_upstream(upstream: UpstreamSession) -> bytes:
    return orjson.dumps([upstream.replica, upstream.session_id])


def decode_upstream(raw: bytes | str) -> UpstreamSession | None:
    """An upstream session as encode_upstream wrote it; None for anything else."""
    try:
        value: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    match value:
        case [str(replica), str(session_id)]:
            return UpstreamSession(replica, session_id)
    return None


def decode_record(
    session_id: str,
    owner: str,
    record: bytes | str,
    expires_at_ms: int,
    upstreams: Mapping[str, UpstreamSession],
    log_level: str = "",
) -> LegacySession | None:
    """The session from its parts as a store keeps them; None when `record` is not one
    encode_record wrote (a store never returns what it cannot read as a whole)."""
    try:
        value: Any = orjson.loads(record)
    except orjson.JSONDecodeError:
        return None
    match value:
        case {
            "tenant": str(tenant),
            "principal": str(principal),
            "protocol_version": str(version),
            "client": str(client),
            "created_at_ms": int(created),
        }:
            return LegacySession(
                session_id=session_id,
                owner=owner,
                tenant=tenant,
                principal=principal,
                protocol_version=version,
                client=client.encode(),
                created_at_ms=created,
                expires_at_ms=expires_at_ms,
                upstreams=dict(upstreams),
                log_level=log_level,
            )
    return None
