"""The `legacy` section: clients of the 2025 era."""

from __future__ import annotations

from pydantic import Field

from gateway.config.section import Section


class LegacyConfig(Section):
    """Clients of the 2025 era (initialize, Mcp-Session-Id, GET and DELETE) on the same endpoint
    (gateway/legacy; docs/legacy-clients.md)."""

    enabled: bool = Field(
        True,
        description="Serve 2025-era clients; off, a 2025-era request gets 400 naming the "
        "revision taskgate serves.",
    )
    session_idle_s: float = Field(
        1800.0, ge=10, le=7 * 86_400, description="A session unused this long expires (404)."
    )
    max_sessions: int = Field(
        100_000, ge=1, description="Live sessions in the store, all instances together."
    )
    max_sessions_per_principal: int | None = Field(
        None, ge=1, description="Deprecated: limits.principal.sessions, which takes precedence."
    )
    max_streams: int = Field(
        1000, ge=0, description="GET streams one process holds at once; more get 503."
    )
    max_streams_per_principal: int | None = Field(
        None,
        ge=1,
        description="Deprecated: limits.principal.session_streams, which takes precedence.",
    )
    session_cache_s: float = Field(
        1.0,
        ge=0,
        le=60,
        description="How long an instance trusts its last read of a session (0: read the store "
        "on every request); an end elsewhere reaches it this late (docs/legacy-clients.md).",
    )
    max_client_bytes: int = Field(
        16_384,
        ge=512,
        le=1_048_576,
        description="The capabilities and clientInfo a client declares, as JSON; more get 400.",
    )
    upstream_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description="Deadline of opening, ending or notifying an upstream session.",
    )
    max_pending_events: int = Field(
        256,
        ge=16,
        le=100_000,
        description="Events one GET stream may owe a client that does not read; past it the "
        "stream ends (the client opens it again).",
    )
    max_pending_bytes: int = Field(
        256 * 1024 * 1024,
        ge=65_536,
        description="Event bytes all GET streams of a process owe their clients together; past "
        "it the stream owing the most is cut (its client opens it again).",
    )
