"""The `listen` and `admin` sections: the public listener and the operator's."""

from __future__ import annotations

from pydantic import Field, model_validator

from gateway.config.section import Section


class ListenConfig(Section):
    """The public listener and the checks applied before a body is read."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    path: str = Field("/mcp", pattern=r"^/[^\s?#]*$")
    strict_headers: bool = Field(
        False,
        description="Refuse tasks/* requests that omit Mcp-Name (400, -32020) instead of "
        "routing on the body; tools/call, prompts/get and resources/read always require it.",
    )
    allowed_origins: tuple[str, ...] = Field(
        (), description="Origins allowed besides loopback ones; '*' allows any."
    )
    allowed_hosts: tuple[str, ...] = Field(
        (),
        description="Host header names allowed besides loopback ones when listening on loopback.",
    )
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    max_json_depth: int = Field(64, ge=4, le=512)
    read_timeout_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="A client must send a whole request, head and body, within this time (408).",
    )
    max_in_flight: int = Field(
        1000, ge=1, description="Requests served at once; beyond it: 503 and Retry-After at once."
    )
    tenant_share: float | None = Field(
        None, gt=0, le=1, description="Deprecated: limits.tenant_share, which takes precedence."
    )
    drain_timeout_s: float = Field(
        30.0, ge=0, le=3600, description="On SIGTERM, how long in-flight requests may finish."
    )
    max_header_bytes: int = Field(
        8190,
        ge=1024,
        le=65536,
        description="One header line's limit, and the request target's (431, 414).",
    )
    max_headers: int = Field(100, ge=16, le=1000, description="Header fields per request.")
    max_head_bytes: int = Field(
        64 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="A request's whole head: request line and header lines (431 past it).",
    )
    max_connections: int = Field(
        10_000,
        ge=1,
        description="Client connections open at once; one more is answered 503 and closed.",
    )
    max_buffered_bytes: int = Field(
        128 * 1024 * 1024,
        ge=64 * 1024,
        description="Request bytes held in memory over all connections (bodies read, pipelined "
        "bytes waiting); a request that would pass it gets 503 and Retry-After.",
    )
    max_answer_buffer_bytes: int = Field(
        1024 * 1024 * 1024,
        ge=1024 * 1024,
        description="Answer bytes held for clients over all connections (read from replicas, "
        "not yet sent); past it, reading replicas' answers pauses for the connections holding "
        "more than max_answer_buffer_bytes / max_connections, within each request's deadline.",
    )
    keepalive_timeout_s: float = Field(
        75.0, gt=0, le=3600, description="An idle client connection closes after this long."
    )
    max_requests_per_connection: int | None = Field(
        None,
        ge=1,
        description="Requests served on one connection before it closes (the last answer says "
        "Connection: close); null: no limit.",
    )

    @model_validator(mode="after")
    def _head_holds_a_line(self) -> ListenConfig:
        if self.max_head_bytes < self.max_header_bytes:
            raise ValueError("max_head_bytes must be at least max_header_bytes")
        return self


class AdminConfig(Section):
    """A listener apart from the public one: /healthz and /readyz for probes, and the operator's
    /metrics, status page (/), /reload and /tasks/<id>."""

    host: str = "127.0.0.1"
    port: int = Field(9090, ge=0, le=65535)
    bearer_env: str | None = Field(
        None,
        description="Environment variable holding the admin listener's own bearer token. Off "
        "loopback, every admin path but /healthz and /readyz requires it (403 without one "
        "configured); on loopback it is required when set.",
    )
    allowed_origins: tuple[str, ...] = Field(
        (),
        description="Origins allowed on the operator's paths besides loopback ones; '*' allows "
        "any. The probes are open to any Origin.",
    )
    allowed_hosts: tuple[str, ...] = Field(
        (),
        description="Host header names allowed on the operator's paths besides loopback ones "
        "when the admin listener is on loopback. The probes are open to any Host.",
    )
