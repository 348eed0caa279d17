"""The `limits` section: each tenant's and each principal's fair share (docs/limits.md).

Every limit is off unless configured, but for the tenant's share of the in-flight slots and the
per-principal stream and session counts that taskgate always had. A tenant listed under
`tenants` takes the keys its entry sets (an explicit null lifts that limit for it) and the
defaults for the rest.
"""

from __future__ import annotations

from typing import Literal, TypeVar

from pydantic import Field, field_validator, model_validator

from gateway.config.section import Section


class Rate(Section):
    """A token bucket: its rate, and its size."""

    rate_per_s: float | None = Field(
        None,
        gt=0,
        le=1_000_000,
        description="Requests per second (a token bucket every instance shares through a Redis "
        "store); past it: 429 and Retry-After.",
    )
    burst: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="The bucket's size: requests that may come at once after a quiet spell. By "
        "default one second's worth of rate_per_s (at least 1).",
    )

    def bucket_size(self) -> int:
        """The bucket's size: burst, or one second of rate_per_s (at least 1)."""
        if self.burst is not None:
            return self.burst
        return max(1, int(self.rate_per_s or 1))


class Allowance(Rate):
    """What one tenant, or one principal, may use. Null: no limit."""

    concurrent: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Requests in flight at once, on each instance (a slot is a process's); "
        "past it: 429.",
    )
    live_tasks: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="Tasks held in the store (routed and taskgate's own) until their ttl; a "
        "tools/call past it: 429.",
    )
    tasks_per_minute: float | None = Field(
        None,
        gt=0,
        le=10_000_000,
        description="Task creations per minute (a token bucket of a minute's size); a tools/call "
        "past it: 429.",
    )
    listen_streams: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="subscriptions/listen streams open at once, per process.",
    )
    session_streams: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="2025-era GET streams open at once, per process.",
    )


class PrincipalAllowance(Allowance):
    """A principal's limits: a tenant's, with the stream counts taskgate always had (once
    subscriptions.max_streams_per_principal and legacy.max_streams_per_principal), and the
    2025-era sessions it may keep (once legacy.max_sessions_per_principal)."""

    listen_streams: int | None = Field(
        16,
        ge=1,
        le=1_000_000,
        description="subscriptions/listen streams open at once, per process.",
    )
    session_streams: int | None = Field(
        16, ge=1, le=1_000_000, description="2025-era GET streams open at once, per process."
    )
    sessions: int | None = Field(
        32,
        ge=1,
        le=1_000_000,
        description="Live 2025-era sessions in the store; past it, its least recently used one "
        "ends.",
    )


class ToolRate(Rate):
    """Calls per second to one tool, for each tenant: a token bucket of its own per tenant,
    beside the tenant's and the principal's request buckets. Its rate_per_s is required."""

    rate_per_s: float = Field(  # required here, optional in Rate
        ...,
        gt=0,
        le=1_000_000,
        description="tools/call of this tool per second, per tenant; past it: 429.",
    )


class TenantLimits(Section):
    """One tenant's overrides: for the tenant, for each of its principals, and per tool."""

    tenant: Allowance = Field(Allowance(), description="Keys set here replace limits.tenant's.")
    principal: PrincipalAllowance = Field(
        PrincipalAllowance(), description="Keys set here replace limits.principal's."
    )
    tools: dict[str, ToolRate | None] = Field(
        {},
        description="Tools set here replace limits.tools' entry for this tenant; null lifts it.",
    )


class PollingConfig(Section):
    """tasks/get sooner than the task's pollIntervalMs asks (docs/limits.md, "Polling")."""

    mode: Literal["off", "snapshot", "refuse"] = Field(
        "off",
        description="off: every tasks/get goes to the task's owner. snapshot: one sooner than "
        "tolerance x pollIntervalMs after the caller's last answered one gets that answer "
        "again (the owner is not asked). refuse: it gets 429 and Retry-After.",
    )
    tolerance: float = Field(
        0.5,
        gt=0,
        le=1,
        description="The share of pollIntervalMs that counts as polling on time.",
    )
    max_snapshots: int = Field(
        10_000,
        ge=1,
        le=1_000_000,
        description="Last answers one process keeps (one per task and caller; the oldest go).",
    )

    @field_validator("mode", mode="before")
    @classmethod
    def _off_unquoted(cls, value: object) -> object:
        # YAML 1.1 (PyYAML) reads an unquoted `off` as false: `mode: off` means "off".
        return "off" if value is False else value


class LimitsConfig(Section):
    """Fair shares between tenants and principals; reloadable (docs/limits.md)."""

    tenant_share: float | None = Field(
        None,
        gt=0,
        le=1,
        description="The most one tenant may hold of listen.max_in_flight, and of each "
        "backend's max_in_flight: max(1, floor(share x limit)); beyond it: 503 and Retry-After. "
        "1 turns it off; with auth mode none it is off (one anonymous caller). By default 0.5.",
    )
    tenant: Allowance = Field(Allowance(), description="Each tenant's limits, counted apart.")
    principal: PrincipalAllowance = Field(
        PrincipalAllowance(), description="Each principal's limits, within its tenant."
    )
    tools: dict[str, ToolRate] = Field(
        {},
        description="Rates per tool name (as clients call it), each tenant counted apart.",
    )
    tenants: dict[str, TenantLimits] = Field(
        {}, description="Overrides by the tenant claim's value."
    )
    polling: PollingConfig = PollingConfig()
    pause_refused_ms: int = Field(
        0,
        ge=0,
        le=60_000,
        description="After a 429 of these limits, the caller's connection is not read for the "
        "wait its answer gave, at most this long: a client that retries at once then waits on "
        "its own socket instead of costing a refusal each time. 0 (the default): read on at "
        "once. Leave it 0 behind a proxy that sends many tenants' requests on one connection.",
    )
    max_tracked: int = Field(
        100_000,
        ge=16,
        le=10_000_000,
        description="Tenants and principals one process tracks at once for its in-process "
        "counts (concurrency, streams; with SQLite the buckets and task counts too).",
    )

    @field_validator("tools")
    @classmethod
    def _tool_names(cls, tools: dict[str, ToolRate]) -> dict[str, ToolRate]:
        for name in tools:
            if not name:
                raise ValueError("a tool name must not be empty")
        return tools

    def tools_of(self, entry: TenantLimits | None) -> dict[str, ToolRate]:
        """The tool rates of a tenant with `entry` under `tenants` (None: the defaults)."""
        if entry is None or not entry.tools:
            return self.tools
        found = dict(self.tools)
        for name, rate in entry.tools.items():
            if rate is None:
                found.pop(name, None)
            else:
                found[name] = rate
        return found

    @model_validator(mode="after")
    def _bursts_have_rates(self) -> LimitsConfig:
        scopes: list[tuple[str, Allowance]] = [
            ("tenant", self.tenant),
            ("principal", self.principal),
        ]
        for name, entry in self.tenants.items():
            if not name:
                raise ValueError("tenants: a tenant name must not be empty")
            scopes.append((f"tenants.{name}.tenant", merged(self.tenant, entry.tenant)))
            scopes.append((f"tenants.{name}.principal", merged(self.principal, entry.principal)))
        for where, scope in scopes:
            if scope.burst is not None and scope.rate_per_s is None:
                raise ValueError(f"{where}: burst needs rate_per_s")
        return self


A = TypeVar("A", bound=Allowance)


def merged(default: A, override: Allowance) -> A:
    """`default` with the keys `override` sets (null included) in their place."""
    changes = {key: getattr(override, key) for key in override.model_fields_set}
    return default.model_copy(update=changes) if changes else default
