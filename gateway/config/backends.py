"""The `backends` and `health` sections: the replicas taskgate calls, and how it judges them."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from gateway.config.section import Section


class UpstreamAuthConfig(Section):
    """taskgate's own credential for a backend: the client's token never goes upstream."""

    bearer_env: str | None = Field(None, description="Environment variable holding the token.")
    bearer_file: str | None = Field(None, description="File holding the token.")

    @model_validator(mode="after")
    def _one_source(self) -> UpstreamAuthConfig:
        if (self.bearer_env is None) == (self.bearer_file is None):
            raise ValueError("give exactly one of bearer_env and bearer_file")
        return self


class IdentityHeadersConfig(Section):
    """Headers that tell a backend who the verified caller is (never taken from the client)."""

    tenant: str | None = Field(None, pattern=r"^[A-Za-z0-9-]+$")
    principal: str | None = Field(None, pattern=r"^[A-Za-z0-9-]+$")


class BackendSessionsConfig(Section):
    """The 2025-era sessions taskgate opens for callers on this backend's replicas of the 2025
    era: one per replica, caller and declared capabilities (README, "Backends of the 2025
    era")."""

    max_per_replica: int = Field(
        256,
        ge=1,
        le=100_000,
        description="Sessions kept open on one replica; past it the least recently used idle "
        "one is ended (DELETE).",
    )
    idle_s: float = Field(
        600.0, gt=0, le=86_400, description="A session unused this long is ended (DELETE)."
    )
    input_wait_s: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description="How long a call whose server asked the client a question (elicitation, "
        "sampling, roots) waits for the client's retry with the answer; then it is cancelled "
        "upstream.",
    )
    max_waiting_per_replica: int = Field(
        64,
        ge=0,
        le=100_000,
        description="Calls held open on one replica while their clients answer; past it a "
        "server's question is declined (0: every question is).",
    )


class BackendConfig(Section):
    """A named group of replicas serving the same MCP server."""

    replicas: tuple[str, ...] = Field(min_length=1)
    era: Literal["auto", "2026-07-28", "2025"] = Field(
        "auto",
        description="What the replicas speak. auto: learned per replica (server/discover, "
        "then initialize when it is refused), again on reconnect and reload; 2025: servers "
        "that speak only initialize and sessions (the Python and TypeScript SDKs 1.x).",
    )
    sessions: BackendSessionsConfig = BackendSessionsConfig()
    timeout_s: float = Field(30.0, gt=0, le=86_400, description="Deadline of one tools/call.")
    task_timeout_s: float = Field(
        10.0, gt=0, le=3600, description="Deadline of one tasks/get, tasks/update, tasks/cancel."
    )
    max_in_flight: int = Field(
        256, ge=1, description="Calls to this backend at once; beyond it: 503 and Retry-After."
    )
    upstream_auth: UpstreamAuthConfig | None = None
    identity_headers: IdentityHeadersConfig = IdentityHeadersConfig()
    max_answer_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="A JSON answer (or a 4xx body) is read whole before it is relayed; larger: "
        "502. Event streams are relayed as they come, with back-pressure.",
    )
    max_header_bytes: int | None = Field(
        None,
        ge=1024,
        le=65536,
        description="One header line of a replica's answer; past it 502 (default: "
        "listen.max_header_bytes).",
    )
    max_headers: int | None = Field(
        None,
        ge=16,
        le=1000,
        description="Header fields of a replica's answer; more: 502 (default: listen.max_headers).",
    )
    task_affinity: Literal["replica", "backend"] = Field(
        "replica",
        description="replica: only the replica that created a task serves it. backend: the "
        "replicas share a task store (e.g. FastMCP on redis://), any of them may serve it.",
    )

    @field_validator("replicas")
    @classmethod
    def _http_urls(cls, replicas: tuple[str, ...]) -> tuple[str, ...]:
        for url in replicas:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"replica {url!r} is not an http(s) URL with a host")
            if parts.query or parts.fragment:
                raise ValueError(f"replica {url!r} must not carry a query or fragment")
            if parts.username is not None or parts.password is not None:
                raise ValueError(
                    f"replica {parts.scheme}://...@{parts.netloc.rpartition('@')[2]} must not "
                    "carry credentials in its URL; use upstream_auth"
                )
        if len(set(replicas)) != len(replicas):
            raise ValueError("replicas must be distinct")
        return replicas


class HealthConfig(Section):
    """Replica health: active server/discover probes and passive ejection on failures."""

    interval_s: float = Field(5.0, gt=0, le=3600, description="Time between active probes.")
    timeout_s: float = Field(2.0, gt=0, le=60, description="Deadline of one probe.")
    unhealthy_after: int = Field(
        3, ge=1, description="Consecutive failures (probes or calls) that eject a replica."
    )
    healthy_after: int = Field(1, ge=1, description="Consecutive successes that reinstate it.")
