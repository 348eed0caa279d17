"""The `limits` section resolved per tenant: which buckets and counts a request asks for.

Resolved once per configuration (a reload makes a new Policy): a tenant without an entry in
limits.tenants shares the default Scope, so the hot path is a dict lookup and, when no rate or
task limit applies to the tenant, no store call at all.
"""

from __future__ import annotations

from gateway.config.limits import Allowance, LimitsConfig, PrincipalAllowance, ToolRate, merged
from gateway.limits.concurrency import Concurrency
from gateway.store.limits import Bucket, Count

# The label a tenant's refusals are counted under in /metrics when limits.tenants does not name
# it: tenant ids are unbounded, the configured names are not.
DEFAULT_LABEL = "default"
LEASE_SHARE = 0.05


def _rate_bucket(key: str, allowance: Allowance) -> Bucket | None:
    if allowance.rate_per_s is None:
        return None
    return Bucket(key, allowance.rate_per_s / 1000, float(allowance.bucket_size()), 1)


def _tool_bucket(tool: str, rate: ToolRate) -> Bucket:
    # "u": a tool's uses; the rest of the key is the tool's name, whatever it holds
    return Bucket("u" + tool, rate.rate_per_s / 1000, float(rate.bucket_size()), 1)


def _lease_of(buckets: list[Bucket]) -> int:
    """The most tokens one lease takes from `buckets`: 5% of a second of the smallest rate
    (and of its burst), at least 1."""
    return max(1, min((int(min(b.size, b.per_ms * 1000) * LEASE_SHARE) for b in buckets),
                      default=1))  # fmt: skip


def _creation_bucket(key: str, allowance: Allowance) -> Bucket | None:
    per_minute = allowance.tasks_per_minute
    if per_minute is None:
        return None
    return Bucket(key, per_minute / 60_000, max(1.0, per_minute), 0)


class Scope:
    """One tenant's limits, resolved: its own, and each of its principals'."""

    __slots__ = (
        "_principal_creations",
        "_principal_rate",
        "_principal_tasks",
        "creates",
        "label",
        "lease",
        "names",
        "principal",
        "quota_lease",
        "rated",
        "tenant",
        "tenant_buckets",
        "tenant_counts",
        "tenant_creations",
        "tools",
    )

    def __init__(
        self,
        label: str,
        tenant: Allowance,
        principal: PrincipalAllowance,
        tools: dict[str, ToolRate] | None = None,
    ) -> None:
        self.label = label  # the /metrics label: the tenant's name in limits.tenants, or default
        self.tenant = tenant
        self.principal = principal
        rate = _rate_bucket("r", tenant)
        self.tenant_buckets = () if rate is None else (rate,)
        self._principal_rate = _rate_bucket("r:", principal)
        creation = _creation_bucket("c", tenant)
        self.tenant_creations = () if creation is None else (creation,)
        self._principal_creations = _creation_bucket("c:", principal)
        tasks = tenant.live_tasks
        self.tenant_counts = () if tasks is None else (Count("t", tasks),)
        self._principal_tasks = principal.live_tasks
        self.rated = bool(self.tenant_buckets) or self._principal_rate is not None
        # The most tokens one lease takes from a shared store: 5% of a second of the smaller
        # rate (and of its burst), at least 1.
        rates = [b for b in (rate, self._principal_rate) if b is not None]
        self.lease = _lease_of(rates)
        # tool name -> its bucket and the lease of a call to it (which takes from the tenant's
        # and principal's buckets too)
        self.tools: dict[str, tuple[Bucket, int]] = {}
        for name, tool_rate in (tools or {}).items():
            bucket = _tool_bucket(name, tool_rate)
            self.tools[name] = (bucket, _lease_of([*rates, bucket]))
        self.creates = bool(self.tenant_creations or self.tenant_counts) or (
            self._principal_creations is not None or self._principal_tasks is not None
        )
        # The most calls that may create a task one quota lease lets through (the limiter's
        # _quota): 5% of the smallest task quota, so none below 20: a small quota is asked of
        # the store on every call, and stays exact across instances.
        quotas = [float(c.limit) for c in self.tenant_counts] + [b.size for b in (creation,
                  self._principal_creations) if b is not None]  # fmt: skip
        if self._principal_tasks is not None:
            quotas.append(float(self._principal_tasks))
        self.quota_lease = int(min(quotas, default=0.0) * LEASE_SHARE)

    def requests(self, principal: str) -> tuple[Bucket, ...]:
        """The rate buckets of one request of `principal`."""
        own = self._principal_rate
        if own is None:
            return self.tenant_buckets
        return (*self.tenant_buckets, _keyed(own, principal))

    def creations(self, principal: str) -> tuple[Bucket, ...]:
        """The buckets of one task creation of `principal` (cost 0 when asked before the call)."""
        own = self._principal_creations
        if own is None:
            return self.tenant_creations
        return (*self.tenant_creations, _keyed(own, principal))

    def counts(self, principal: str) -> tuple[Count, ...]:
        """The live-task counts one task of `principal` enters."""
        own = self._principal_tasks
        if own is None:
            return self.tenant_counts
        return (*self.tenant_counts, Count("t:" + principal, own))


def _keyed(bucket: Bucket, principal: str) -> Bucket:
    return Bucket(bucket.key + principal, bucket.per_ms, bucket.size, bucket.cost)


class Policy:
    """Every tenant's Scope, from one configuration."""

    __slots__ = ("any", "concurrency", "config", "default", "scopes")

    def __init__(self, config: LimitsConfig, principal_defaults: PrincipalAllowance) -> None:
        self.config = config
        self.default = Scope(
            DEFAULT_LABEL, config.tenant, principal_defaults, config.tools_of(None)
        )
        self.scopes = {
            name: Scope(
                name,
                merged(config.tenant, entry.tenant),
                merged(principal_defaults, entry.principal),
                config.tools_of(entry),
            )
            for name, entry in config.tenants.items()
        }
        every = (self.default, *self.scopes.values())
        # a store call at all
        self.any = any(scope.rated or scope.creates or scope.tools for scope in every)
        self.concurrency = _concurrency(self.default, self.scopes)

    def of(self, tenant: str) -> Scope:
        return self.scopes.get(tenant, self.default)


def _concurrency(default: Scope, scopes: dict[str, Scope]) -> Concurrency | None:
    """The coordinator's part: None when no tenant and no principal has a concurrent limit."""

    def pair(scope: Scope) -> tuple[int | None, int | None]:
        return scope.tenant.concurrent, scope.principal.concurrent

    tenants = {name: pair(scope) for name, scope in scopes.items()}
    if pair(default) == (None, None) and all(p == (None, None) for p in tenants.values()):
        return None
    return Concurrency(pair(default), tenants)
