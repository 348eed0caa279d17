"""YAML configuration: frozen pydantic models, cross-checks, errors that name the YAML path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gateway.config.loopback import is_loopback
from gateway.store.redis_url import TLS_SCHEMES, StoreURLError, parse_redis_url, scheme_of

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenConfig(_Model):
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
    tenant_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="The most one tenant may hold of max_in_flight, and of each backend's "
        "max_in_flight: max(1, floor(share x limit)); beyond it: 503 and Retry-After. 1 turns "
        "it off; with auth mode none it is off (one anonymous caller).",
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


class StoreTLSConfig(_Model):
    """PEM files for TLS to Redis (rediss://, rediss+sentinel://, rediss+cluster://); relative
    paths name files beside the configuration file. The server's certificate is always
    verified, its host name included."""

    ca_file: str | None = Field(
        None,
        min_length=1,
        description="The CA that signed the servers' certificates; unset: the system's CAs.",
    )
    cert_file: str | None = Field(
        None,
        min_length=1,
        description="A client certificate, for servers that ask for one (tls-auth-clients).",
    )
    key_file: str | None = Field(
        None, min_length=1, description="The client certificate's private key (unencrypted)."
    )

    @model_validator(mode="after")
    def _key_with_its_certificate(self) -> StoreTLSConfig:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("key_file is the key of cert_file: give cert_file too")
        return self


class StoreConfig(_Model):
    """Where task routes live: SQLite for one node, Redis (one server, Sentinel, Cluster) for
    several."""

    url: str = Field(
        "sqlite:///./taskgate-routes.db",
        description="sqlite:///relative.db (beside the configuration file), "
        "sqlite:////absolute.db, redis://[:password@]host:port/db, rediss://... (TLS), "
        "redis+sentinel://[:password@]host:port[,host:port...]/service[/db], "
        "redis+cluster://[:password@]host:port[,host:port...] (seed nodes); "
        "rediss+sentinel:// and rediss+cluster:// for TLS to every node",
    )
    tls: StoreTLSConfig | None = Field(
        None,
        description="Files for TLS; only with rediss://, rediss+sentinel://, rediss+cluster://.",
    )
    timeout_s: float = Field(2.0, gt=0, le=60, description="Deadline of one store operation.")
    cache_size: int = Field(
        10_000, ge=0, description="Found routes kept in process memory (0 turns the cache off)."
    )
    durability: Literal["none", "wait_aof", "wait_replicas"] = Field(
        "none",
        description="Redis only: after recording a route, wait for the local AOF fsync "
        "(WAITAOF, Redis >= 7.2) or for `wait_replicas` replicas (WAIT) before relaying it; "
        "on a cluster, the replicas of the master that holds the route.",
    )
    wait_replicas: int | None = Field(
        None,
        ge=0,
        le=16,
        description="Replicas that must acknowledge (wait_replicas, default 1) or fsync "
        "(wait_aof, default 0) each route.",
    )
    wait_timeout_ms: int = Field(500, ge=1, le=60_000)
    max_connections: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="Redis only: taskgate's connections to the store per process (of a cluster, "
        "to each node); an operation finding all in use waits for one, at most timeout_s. "
        "By default listen.max_in_flight + 16, at most 256.",
    )

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if scheme_of(url) == "sqlite":
            if not sqlite_path(url):
                raise ValueError(
                    "a sqlite URL names a file: sqlite:///relative.db or sqlite:////abs.db"
                )
            return url
        try:
            parse_redis_url(url)
        except StoreURLError as exc:
            raise ValueError(f"{exc}; or use sqlite:///routes.db") from None
        return url

    @property
    def replicas_to_wait_for(self) -> int:
        if self.durability == "none":
            return 0
        default = 1 if self.durability == "wait_replicas" else 0
        return default if self.wait_replicas is None else self.wait_replicas

    @model_validator(mode="after")
    def _durability_needs_redis(self) -> StoreConfig:
        if self.durability != "none" and self.url.startswith("sqlite:"):
            raise ValueError("durability applies to Redis; SQLite always syncs (synchronous=FULL)")
        if self.max_connections is not None and self.url.startswith("sqlite:"):
            raise ValueError("max_connections applies to Redis; SQLite uses one connection")
        return self

    @model_validator(mode="after")
    def _tls_needs_a_tls_url(self) -> StoreConfig:
        if self.tls is not None and scheme_of(self.url) not in TLS_SCHEMES:
            raise ValueError(
                "tls applies to rediss://, rediss+sentinel:// and rediss+cluster:// URLs; "
                f"this one is {scheme_of(self.url)}://"
            )
        return self


def sqlite_path(url: str) -> str:
    """The file of a sqlite:/// URL: sqlite:///./a.db is ./a.db, sqlite:////tmp/a.db /tmp/a.db."""
    return urlsplit(url).path[1:]


class TasksConfig(_Model):
    """How long task routes live."""

    grace_s: float = Field(
        60.0, ge=0, description="A route outlives its task's createdAt + ttlMs by this much."
    )
    unlimited_ttl_cap_s: float = Field(
        7 * 24 * 3600.0, gt=0, description="Lifetime of the route of a task with ttlMs: null."
    )
    record_timeout_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description="Longest wait for a route to be recorded before failing closed.",
    )


_ALGORITHMS = Literal["RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA", "HS256"]


class KeyConfig(_Model):
    """A verification key from a file (PEM public key; for HS256 a secret from the environment)."""

    kid: str = Field(min_length=1)
    alg: _ALGORITHMS
    file: str | None = Field(None, description="PEM public key (asymmetric algorithms).")
    secret_env: str | None = Field(
        None, description="Environment variable holding an HS256 secret."
    )

    @model_validator(mode="after")
    def _one_source(self) -> KeyConfig:
        if self.alg == "HS256":
            if self.secret_env is None or self.file is not None:
                raise ValueError("an HS256 key takes secret_env (and no file)")
        elif self.file is None or self.secret_env is not None:
            raise ValueError(f"a {self.alg} key takes file (a PEM public key), not secret_env")
        return self


class ResourceMetadataConfig(_Model):
    """RFC 9728 Protected Resource Metadata, served under /.well-known/oauth-protected-resource."""

    authorization_servers: tuple[str, ...] = ()
    scopes_supported: tuple[str, ...] = ()
    url: str | None = Field(
        None,
        description="Where clients fetch the metadata; default: derived from `audience` "
        "(https://host/.well-known/oauth-protected-resource/<path>).",
    )


class AuthConfig(_Model):
    """How callers are authenticated: `jwt`, or `none` for local development on loopback only."""

    mode: Literal["none", "jwt"] = "none"
    issuer: str | None = None
    audience: str | None = Field(None, description="taskgate's own resource URI.")
    jwks_url: str | None = None
    keys: tuple[KeyConfig, ...] = ()
    algorithms: tuple[_ALGORITHMS, ...] = ("ES256", "RS256", "EdDSA")
    tenant_claim: str = "tenant"
    principal_claim: str = "sub"
    leeway_s: float = Field(30.0, ge=0, le=600)
    jwks_refresh_s: float = Field(300.0, gt=0, description="How long fetched keys are trusted.")
    jwks_min_refresh_s: float = Field(
        30.0, ge=0, description="An unknown kid refetches the JWKS at most this often."
    )
    token_cache_size: int = Field(
        10_000, ge=0, description="Verified tokens remembered (by hash, never past exp; 0: off)."
    )
    task_sharing: Literal["principal", "tenant"] = Field(
        "principal",
        description="principal: a task belongs to the principal that created it. tenant: every "
        "principal of the creating tenant may use it.",
    )
    resource_metadata: ResourceMetadataConfig = ResourceMetadataConfig()

    @model_validator(mode="after")
    def _jwt_is_complete(self) -> AuthConfig:
        if self.mode != "jwt":
            return self
        missing = [k for k in ("issuer", "audience") if getattr(self, k) is None]
        if missing:
            raise ValueError(f"mode jwt needs {' and '.join(missing)}")
        if (self.jwks_url is None) == (not self.keys):
            raise ValueError("mode jwt needs exactly one of jwks_url and keys")
        if "HS256" in self.algorithms and self.jwks_url is not None:
            raise ValueError("HS256 takes configured secrets (keys), never keys from a JWKS URL")
        if any(key.alg not in self.algorithms for key in self.keys):
            raise ValueError("every key's alg must be listed in algorithms")
        if self.jwks_url is not None:
            parts = urlsplit(self.jwks_url)
            if parts.scheme != "https" and not (
                parts.scheme == "http" and is_loopback(parts.hostname)
            ):
                raise ValueError("jwks_url must be https (plain http only on loopback)")
        return self


class UpstreamAuthConfig(_Model):
    """taskgate's own credential for a backend: the client's token never goes upstream."""

    bearer_env: str | None = Field(None, description="Environment variable holding the token.")
    bearer_file: str | None = Field(None, description="File holding the token.")

    @model_validator(mode="after")
    def _one_source(self) -> UpstreamAuthConfig:
        if (self.bearer_env is None) == (self.bearer_file is None):
            raise ValueError("give exactly one of bearer_env and bearer_file")
        return self


class IdentityHeadersConfig(_Model):
    """Headers that tell a backend who the verified caller is (never taken from the client)."""

    tenant: str | None = Field(None, pattern=r"^[A-Za-z0-9-]+$")
    principal: str | None = Field(None, pattern=r"^[A-Za-z0-9-]+$")


class BackendConfig(_Model):
    """A named group of replicas serving the same MCP server."""

    replicas: tuple[str, ...] = Field(min_length=1)
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


ROUTE_KINDS = ("tools", "prompts", "resources", "resource_templates")
"""What a route may expose, in the order `taskgate check` shows them."""

_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*:"
_URI_START = rf"(?:{_SCHEME}|\*)"  # a scheme, or a glob's `*`, which spans the scheme too
_VARCHAR = r"(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2})"
_VARSPEC = rf"{_VARCHAR}(?:\.?{_VARCHAR})*(?::[1-9][0-9]{{0,3}}|\*)?"
_EXPRESSION = rf"\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\}}"
# RFC 6570 syntax, or a glob of it (`*` outside an expression); also a JSON Schema pattern
_TEMPLATE = rf"^{_URI_START}(?:[^{{}}]|{_EXPRESSION})*$"
_URI_START_RE = re.compile(_URI_START)
_EXPRESSION_RE = re.compile(_EXPRESSION)
_TEMPLATE_RE = re.compile(_TEMPLATE)


def _name_or_glob(item: str) -> str:
    if not item.strip():
        raise ValueError("a name or glob must not be empty")
    return item


def _uri_glob(item: str) -> str:
    if not _URI_START_RE.match(item):
        raise ValueError(f"{item!r} is not a URI glob: it starts with a scheme and ':' or with '*'")
    return item


def _uri_template(item: str) -> str:
    if not _URI_START_RE.match(item):
        raise ValueError(
            f"{item!r} is not a URI template: it starts with a scheme and ':' or with '*'"
        )
    if _TEMPLATE_RE.match(item):
        return item
    rest = _EXPRESSION_RE.sub("", item)  # what is left once every good {expression} is gone
    opened, closed = rest.find("{"), rest.find("}")
    if closed != -1 and (opened == -1 or closed < opened):
        problem = "a '}' closes no '{'"
    elif opened != -1 and "}" not in rest[opened:]:
        problem = "a '{' is never closed"
    else:
        problem = "an expression is not like {name}, {+path} or {?a,b}"
    raise ValueError(f"{item!r} is not a URI template: {problem}")


_NameOrGlob = Annotated[
    str, AfterValidator(_name_or_glob), Field(json_schema_extra={"pattern": r"\S"})
]
_UriGlob = Annotated[
    str, AfterValidator(_uri_glob), Field(json_schema_extra={"pattern": f"^{_URI_START}"})
]
_UriTemplate = Annotated[
    str, AfterValidator(_uri_template), Field(json_schema_extra={"pattern": _TEMPLATE})
]


class RouteConfig(_Model):
    """What one backend serves: tools, prompts, resources and resource templates, never renamed.

    For each kind the first matching route in YAML order wins; a route names at least one item.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": [kind], "properties": {kind: {"minItems": 1}}} for kind in ROUTE_KINDS
            ]
        }
    )

    tools: tuple[_NameOrGlob, ...] = Field(
        (), description="Tool names or globs (* ? [..]) that tools/call and tools/list reach."
    )
    prompts: tuple[_NameOrGlob, ...] = Field(
        (), description="Prompt names or globs (* ? [..]): prompts/get, prompts/list, completion."
    )
    resources: tuple[_UriGlob, ...] = Field(
        (),
        description="Resource URIs or URI globs: what resources/read, resources/list and "
        "resource subscriptions reach. Only * is special and it spans '/'; '*' alone is every "
        "URI the backend lists; any other glob never matches a URI with a '.' or '..' segment.",
    )
    resource_templates: tuple[_UriTemplate, ...] = Field(
        (),
        description="uriTemplate strings (RFC 6570, e.g. reports://acme/{id}) or globs of them "
        "(a * outside {..} spans anything; '*' alone is every template the backend lists), "
        "exposed by resources/templates/list, resources/read of the URIs they produce and "
        "completion/complete's ref/resource.",
    )
    backend: str
    tenants: tuple[str, ...] | None = Field(
        None, description="Only these tenants see the route; to others its items do not exist."
    )
    scopes: tuple[str, ...] = Field(
        (), description="Scopes a token needs to use what the route exposes (else 403)."
    )

    @model_validator(mode="after")
    def _names_something(self) -> RouteConfig:
        if not any(getattr(self, kind) for kind in ROUTE_KINDS):
            raise ValueError(f"a route names at least one item of {', '.join(ROUTE_KINDS)}")
        return self


class HealthConfig(_Model):
    """Replica health: active server/discover probes and passive ejection on failures."""

    interval_s: float = Field(5.0, gt=0, le=3600, description="Time between active probes.")
    timeout_s: float = Field(2.0, gt=0, le=60, description="Deadline of one probe.")
    unhealthy_after: int = Field(
        3, ge=1, description="Consecutive failures (probes or calls) that eject a replica."
    )
    healthy_after: int = Field(1, ge=1, description="Consecutive successes that reinstate it.")


class AdminConfig(_Model):
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


class LoggingConfig(_Model):
    """Request logs: one line per request, beside taskgate's own log lines."""

    access: bool = Field(True, description="One line per request (docs/operations.md, fields).")
    format: Literal["text", "json"] = Field(
        "text", description="text: key=value lines; json: one JSON object per line."
    )
    recent_errors: int = Field(
        50, ge=0, le=10_000, description="Failed requests the status page keeps, per process."
    )
    max_pending_bytes: int = Field(
        4 * 1024 * 1024,
        ge=4096,
        le=1024 * 1024 * 1024,
        description="Log lines (the request log's and taskgate's own) waiting to be written "
        "to standard error, per process; lines beyond it are dropped and counted "
        "(taskgate_log_lines_dropped_total), and a line says how many once writing resumes.",
    )
    flush_timeout_s: float = Field(
        2.0, ge=0, le=60, description="At exit, the longest wait for pending log lines."
    )


class TracingConfig(_Model):
    """W3C trace context; OpenTelemetry export with the optional `taskgate[otel]` extra."""

    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP traces endpoint, the full URL (http://collector:4318/v1/traces); "
        "set, taskgate exports spans for the request, the store and the upstream call, and "
        "starts a trace for a request without traceparent; it needs the taskgate[otel] extra "
        "(else it refuses to start). Unset: an incoming traceparent passes upstream as is.",
    )
    service_name: str = Field(
        "taskgate", description="The service.name of taskgate's spans (their resource)."
    )
    sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of the traces taskgate starts that are sampled; a client's "
        "traceparent keeps its own decision.",
    )


class DiscoveryConfig(_Model):
    """How often taskgate refreshes what it knows of its backends, and how it pages its lists."""

    refresh_s: float = Field(30.0, gt=0, le=3600)
    page_size: int = Field(
        100,
        ge=1,
        le=1000,
        description="Most items on one page of prompts/list, resources/list and "
        "resources/templates/list; longer merged lists continue with taskgate's own nextCursor.",
    )


class SubscriptionsConfig(_Model):
    """subscriptions/listen: how many streams, what one may watch, and the pace of what taskgate
    emulates for backends that cannot push."""

    max_streams: int = Field(
        5000, ge=0, description="Listen streams one process holds at once; more get 503."
    )
    max_streams_per_principal: int = Field(
        16, ge=1, description="Listen streams one principal holds at once; more get 503."
    )
    max_task_ids: int = Field(100, ge=0, le=10_000, description="taskIds in one listen.")
    max_resource_uris: int = Field(
        100, ge=0, le=10_000, description="resourceSubscriptions in one listen."
    )
    max_pollers: int = Field(
        10_000, ge=1, description="Tasks one process polls at once, shared by every stream."
    )
    keepalive_s: float = Field(
        15.0, gt=0, le=3600, description="An SSE comment on a stream idle this long."
    )
    default_poll_interval_ms: int = Field(
        2000, ge=10, description="How often a task is polled when it names no pollIntervalMs."
    )
    min_poll_interval_ms: int = Field(
        250,
        ge=10,
        description="The fastest taskgate polls a task, whatever its pollIntervalMs asks.",
    )
    list_poll_s: float | None = Field(
        None,
        gt=0,
        le=3600,
        description="How often the catalogue is compared for list_changed while a stream asks "
        "for it; by default discovery.refresh_s.",
    )
    ack_timeout_s: float = Field(
        5.0,
        gt=0,
        le=60,
        description="How long a listen waits for the upstream listens of its resourceSubscriptions "
        "to be acknowledged; a backend silent that long honours none of its URIs.",
    )
    max_pending_bytes: int = Field(
        256 * 1024 * 1024,
        ge=65_536,
        description="Event bytes all listen streams of a process owe their clients together; "
        "past it the stream owing the most is cut (its client listens again).",
    )


class LegacyConfig(_Model):
    """Clients of the 2025 era (initialize, Mcp-Session-Id, GET and DELETE) on the same endpoint
    (gateway/legacy; README, "Clients of the 2025 era")."""

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
    max_sessions_per_principal: int = Field(
        32,
        ge=1,
        description="Live sessions of one caller; past it, its least recently used one ends.",
    )
    max_streams: int = Field(
        1000, ge=0, description="GET streams one process holds at once; more get 503."
    )
    max_streams_per_principal: int = Field(
        16, ge=1, description="GET streams one principal holds at once; more get 503."
    )
    session_cache_s: float = Field(
        1.0,
        ge=0,
        le=60,
        description="How long an instance trusts its last read of a session (0: read the store "
        "on every request); an end elsewhere reaches it this late (README).",
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


class Config(_Model):
    """The whole taskgate configuration file."""

    listen: ListenConfig = ListenConfig()
    store: StoreConfig = StoreConfig()
    auth: AuthConfig = AuthConfig()
    tasks: TasksConfig = TasksConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    health: HealthConfig = HealthConfig()
    subscriptions: SubscriptionsConfig = SubscriptionsConfig()
    admin: AdminConfig | None = None
    logging: LoggingConfig = LoggingConfig()
    tracing: TracingConfig = TracingConfig()
    legacy: LegacyConfig = LegacyConfig()
    backends: dict[str, BackendConfig] = Field(min_length=1)
    routes: tuple[RouteConfig, ...] = Field(min_length=1)

    @property
    def tenant_share(self) -> float:
        """The share the coordinator applies: listen.tenant_share, but none with auth mode none,
        where every request is the one anonymous caller and a share would only halve the
        process (docs/decisions.md, 35)."""
        return 1.0 if self.auth.mode == "none" else self.listen.tenant_share


class ConfigError(Exception):
    """The configuration is unusable; `problems` name the YAML path of each mistake."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(f"{source}: " + "; ".join(problems))
        self.source = source
        self.problems = problems


def load_config(path: str | Path) -> Config:
    """Read, validate and cross-check a YAML file; relative file paths in it (a sqlite store,
    key files, token files) name files beside it, whatever the working directory."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as unreadable:
        raise ConfigError(source, [f"cannot read: {unreadable.strerror}"]) from None
    except UnicodeDecodeError as undecodable:
        raise ConfigError(source, [f"not UTF-8 text (byte {undecodable.start})"]) from None
    # The folder resolved, not the file: a file that is a link (a Kubernetes ConfigMap's is)
    # still has its neighbours where it is linked from.
    return _beside(parse_config(text, source=source), Path(path).absolute().parent.resolve())


def _beside(config: Config, folder: Path) -> Config:
    """`config` with its relative file paths made absolute under `folder`.

    A configuration is written next to its files: `taskgate run` started by systemd, a
    container or another shell must find the same key and database as `taskgate check` run
    where the file is. Absolute paths and sqlite:///:memory: are left as they are.
    """

    def rebased(file: str) -> str:
        return file if Path(file).is_absolute() else str(folder / file)  # pathlib drops "./"

    update: dict[str, Any] = {}
    store = sqlite_path(config.store.url) if config.store.url.startswith("sqlite:") else None
    if store is not None and store != ":memory:" and not Path(store).is_absolute():
        url = f"sqlite:///{rebased(store)}"
        update["store"] = config.store.model_copy(update={"url": url})
    tls = config.store.tls
    if tls is not None:
        files = {
            key: rebased(file)
            for key in ("ca_file", "cert_file", "key_file")
            if (file := getattr(tls, key)) is not None
        }
        store_update = {"tls": tls.model_copy(update=files)}
        update["store"] = update.get("store", config.store).model_copy(update=store_update)
    if any(key.file is not None for key in config.auth.keys):
        keys = tuple(
            key if key.file is None else key.model_copy(update={"file": rebased(key.file)})
            for key in config.auth.keys
        )
        update["auth"] = config.auth.model_copy(update={"keys": keys})
    backends = dict(config.backends)
    for name, backend in config.backends.items():
        auth = backend.upstream_auth
        if auth is not None and auth.bearer_file is not None:
            auth = auth.model_copy(update={"bearer_file": rebased(auth.bearer_file)})
            backends[name] = backend.model_copy(update={"upstream_auth": auth})
    if backends != config.backends:
        update["backends"] = backends
    return config.model_copy(update=update) if update else config


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping instead of keeping the last.

    PyYAML silently keeps the last value, so a second `routes:` block would drop the first.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<: *anchor" keys may be overridden, which is their point
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key; construct_mapping reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_config(text: str, *, source: str = "<config>") -> Config:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise ConfigError(
            source, [f"{where}invalid YAML: {getattr(exc, 'problem', exc)}"]
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(source, ["the top level must be a mapping"])
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        problems = [_describe(error) for error in errors if not _echo(error, errors)]
        raise ConfigError(source, problems + _unknown_backends(data)) from None
    problems = _cross_check(config)
    if problems:
        raise ConfigError(source, problems)
    return config


def _cross_check(config: Config) -> list[str]:
    problems = [
        f"backends.{name}: backend names use letters, digits, '_', '.', '-'"
        for name in config.backends
        if not _NAME.fullmatch(name)
    ]
    admin = config.admin
    if admin is not None and admin.port == config.listen.port and admin.port != 0:
        problems.append(f"admin.port: {admin.port} is the public listener's port too")
    if config.auth.mode == "none" and not is_loopback(config.listen.host):
        problems.append(
            "auth.mode: none is for local development: listen.host must be loopback "
            "(127.0.0.1, ::1 or localhost); configure mode: jwt to listen elsewhere"
        )
    return problems + _unknown_backends(config.model_dump())


def _unknown_backends(data: dict[str, Any]) -> list[str]:
    """Routes naming a backend that is not configured; works on raw YAML data too."""
    backends = data.get("backends")
    routes = data.get("routes")
    if not isinstance(backends, dict) or not isinstance(routes, list | tuple):
        return []
    return [
        f"routes[{index}].backend: unknown backend {route['backend']!r}"
        for index, route in enumerate(routes)
        if isinstance(route, dict)
        and isinstance(route.get("backend"), str)
        and route["backend"] not in backends
    ]


def _echo(error: Any, errors: list[Any]) -> bool:
    """A list's "too short after validation" that only repeats that one of its items failed
    (pydantic counts what is left): the item's own error says it."""
    if error["type"] != "too_short":
        return False
    loc = tuple(error["loc"])
    return any(
        len(other["loc"]) > len(loc) and tuple(other["loc"][: len(loc)]) == loc for other in errors
    )


def _describe(error: Any) -> str:
    path = "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]
    ).lstrip(".")
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown key"
    elif error["type"] in ("tuple_type", "list_type"):
        # pydantic says "tuple"; the YAML has lists: `tools: echo` for `tools: [echo]`
        given = error.get("input")
        message = (
            f"should be a list, like [{given}]" if isinstance(given, str) else ("should be a list")
        )
    return f"{path or '<top>'}: {message}"


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the configuration file, for editors and for config/schema.json."""
    schema = Config.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "taskgate configuration"
    return schema
