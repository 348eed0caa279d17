"""The in-process table of in-flight requests (never the durable task routes).

It bounds how many requests run at once, in total and per backend, and how many of those one
tenant holds (its share, docs/decisions.md, 35), refusing beyond a bound at once rather than
queueing, and tells readiness when the process is draining. A request enters once its body has
arrived: a client still sending holds a connection, never a slot. In docs/architecture.md,
step 4 takes the slot and step 7 counts it against a backend.
"""

from __future__ import annotations

import time
from typing import TypeVar

from gateway.errors import LimitReached, Overloaded
from gateway.limits.concurrency import Concurrency
from gateway.protocol.codes import RequestId

K = TypeVar("K")

# The limit of a backend the coordinator was given none for: in effect none. The limits come
# from the same configuration as the backends, so a routed call never meets it in practice.
_UNBOUNDED = 1 << 60


def share_of(limit: int, share: float) -> int:
    """The slots of `limit` one tenant may hold: max(1, floor(share x limit)). The epsilon keeps
    a product such as 0.29 x 100 (28.999999999999996 in floating point) at 29."""
    return max(1, int(limit * share + 1e-9))


class Load:
    """What one backend has in flight, in all and per tenant, against its limit and a tenant's
    share of it. A call holds the object itself, so its count goes back here even after a
    reload removed the backend."""

    __slots__ = ("count", "limit", "share", "sweep_at", "tenants")

    def __init__(self, limit: int, share: int, sweep_at: int) -> None:
        self.count = 0
        self.limit = limit
        self.share = share  # the most calls one tenant may have in flight here
        self.sweep_at = sweep_at
        self.tenants: dict[str, int] = {}  # tenant -> calls in flight, 0 kept (see _sweep)


class Entry:
    """One in-flight request. A plain class made per request, as envelope's messages are (why:
    gateway/protocol/envelope.py)."""

    __slots__ = ("load", "principal", "started", "tenant")

    def __init__(self, tenant: str, started: float) -> None:
        self.tenant = tenant  # "" for every request of auth mode none: one shared key
        self.load: Load | None = None  # None while the request is not routed yet
        self.started = started
        self.principal: tuple[str, str] | None = None  # counted when a principal limit applies


class Admission:
    """The context of one admitted request: a plain class, since a generator-based context
    manager costs a measurable share of a request on the hot path."""

    __slots__ = ("_coordinator", "_key")

    def __init__(self, coordinator: Coordinator, key: int) -> None:
        self._coordinator = coordinator
        self._key = key

    def __enter__(self) -> int:
        return self._key

    def __exit__(self, *exc: object) -> None:
        self._coordinator._release(self._key)


class Coordinator:
    def __init__(
        self, max_in_flight: int, backend_limits: dict[str, int], *, tenant_share: float
    ) -> None:
        self._max = max_in_flight
        self._tenant_max = share_of(max_in_flight, tenant_share)
        self._entries: dict[int, Entry] = {}
        self._tenants: dict[str, int] = {}  # tenant -> requests in flight, 0 kept (see _sweep)
        self._principals: dict[tuple[str, str], int] = {}  # (tenant, principal) -> requests
        self._caps: Concurrency | None = None  # None: no concurrency limit is configured
        self._loads: dict[str, Load] = {}
        self._next = 0
        self.draining = False
        self.reconfigure(backend_limits, tenant_share)

    @property
    def in_flight(self) -> int:
        return len(self._entries)

    def per_backend(self) -> dict[str, int]:
        return {name: load.count for name, load in self._loads.items() if load.count}

    def per_tenant(self) -> dict[str, int]:
        """Requests in flight per tenant (those with none are absent)."""
        return {tenant: held for tenant, held in self._tenants.items() if held}

    def tenant_limit(self, tenant: str) -> int:
        """The requests `tenant` may hold in flight here: its share, or its own lower limit."""
        caps = self._caps
        cap = None if caps is None else caps.tenants.get(tenant, caps.default)[0]
        return self._tenant_max if cap is None else min(cap, self._tenant_max)

    def per_backend_tenant(self) -> dict[str, dict[str, int]]:
        """Calls in flight per backend and tenant (those with none are absent)."""
        return {
            name: {tenant: held for tenant, held in load.tenants.items() if held}
            for name, load in self._loads.items()
            if load.count
        }

    def reconfigure(self, backend_limits: dict[str, int], tenant_share: float) -> None:
        """A reload's backend limits and share (listen.max_in_flight needs a restart). Requests
        in flight stay counted and are given back to the load they took; a removed backend's
        load is kept while it has calls in flight, so that a reload adding it back finds them."""
        self._tenant_max = share_of(self._max, tenant_share)
        loads: dict[str, Load] = {}
        for name, limit in backend_limits.items():
            load = self._loads.get(name)
            if load is None:
                load = Load(limit, 0, 0)
            load.limit = limit
            load.share = share_of(limit, tenant_share)
            load.sweep_at = 2 * min(limit, self._max)
            loads[name] = load
        for name, load in self._loads.items():
            if name not in loads and load.count:
                loads[name] = load
        self._loads = loads

    def limit(self, caps: Concurrency | None) -> None:
        """The tenants' and principals' own limits (limits.*.concurrent), from a reload too."""
        self._caps = caps

    def request(self, tenant: str, principal: str = "") -> Admission:
        """Admit one downstream request of `tenant`'s `principal`, or raise Overloaded (the
        process or the tenant's share is full) or LimitReached (the tenant's or principal's
        own limit); the entry dies with the block (`with coordinator.request(t, p) as key:`)."""
        if self.draining:
            raise Overloaded("taskgate is shutting down; retry on another instance")
        if len(self._entries) >= self._max:
            raise Overloaded(f"taskgate is at its limit of {self._max} requests; retry")
        tenants = self._tenants
        held = tenants.get(tenant, 0)
        caps = self._caps
        who = None if caps is None else self._capped(caps, tenant, principal, held)
        if held >= self._tenant_max:
            raise Overloaded(
                f"{_holder(tenant)} share of {self._tenant_max} of taskgate's {self._max} "
                "requests in flight (limits.tenant_share); retry"
            )
        if held == 0 and len(tenants) >= 2 * self._max:
            _sweep(tenants)
        tenants[tenant] = held + 1
        self._next += 1
        key = self._next
        entry = self._entries[key] = Entry(tenant, time.monotonic())
        if who is not None:
            entry.principal = who
            principals = self._principals
            if who not in principals and len(principals) >= 2 * self._max:
                _sweep(principals)
            principals[who] = principals.get(who, 0) + 1
        return Admission(self, key)

    def _capped(
        self, caps: Concurrency, tenant: str, principal: str, held: int
    ) -> tuple[str, str] | None:
        """Raise LimitReached past the tenant's or the principal's own limit; the principal's
        key when its requests are counted."""
        tenant_cap, principal_cap = caps.tenants.get(tenant, caps.default)
        if tenant_cap is not None and held >= tenant_cap:
            raise LimitReached(
                f"This tenant's limit of {tenant_cap} requests in flight is reached "
                "(limits.tenant.concurrent)",
                limit="tenant.concurrent",
                retry_after_ms=1000,
            )
        if principal_cap is None:
            return None
        who = (tenant, principal)
        if self._principals.get(who, 0) >= principal_cap:
            raise LimitReached(
                f"This principal's limit of {principal_cap} requests in flight is reached "
                "(limits.principal.concurrent)",
                limit="principal.concurrent",
                retry_after_ms=1000,
            )
        return who

    def _release(self, key: int) -> None:
        entry = self._entries.pop(key)
        self._tenants[entry.tenant] -= 1
        if entry.principal is not None:
            self._principals[entry.principal] -= 1
        load = entry.load
        if load is not None:
            load.count -= 1
            load.tenants[entry.tenant] -= 1

    def route(self, key: int, backend: str, request_id: RequestId) -> None:
        """Count the request against `backend`, or raise Overloaded when the backend is at its
        limit or the request's tenant holds its share of it."""
        entry = self._entries[key]
        load = self._loads.get(backend)
        if load is None:
            load = self._loads[backend] = Load(_UNBOUNDED, _UNBOUNDED, 2 * self._max)
        if entry.load is load:
            return
        if load.count >= load.limit:
            raise Overloaded(
                f"Backend {backend!r} is at its limit of {load.limit} calls; retry",
                request_id=request_id,
            )
        tenant = entry.tenant
        tenants = load.tenants
        held = tenants.get(tenant, 0)
        if held >= load.share:
            raise Overloaded(
                f"{_holder(tenant)} share of {load.share} of the {load.limit} calls in flight "
                f"to backend {backend!r} (limits.tenant_share); retry",
                request_id=request_id,
            )
        previous = entry.load
        if previous is not None:  # a 2025-era batch moves on to its next member's backend
            previous.count -= 1
            previous.tenants[tenant] -= 1
        if held == 0 and len(tenants) >= load.sweep_at:
            _sweep(tenants)
        entry.load = load
        load.count += 1
        tenants[tenant] = held + 1


def _sweep(counts: dict[K, int]) -> None:
    """Forget the tenants with nothing in flight. A count that reaches 0 keeps its key, so that
    a tenant's next request is a lookup and an increment, never an insert; the table is swept
    when a new tenant would make it twice its limit, which holds it at that (at most the
    limit's count are held) and happens at most once per limit's worth of new tenants."""
    for tenant in [tenant for tenant, held in counts.items() if not held]:
        del counts[tenant]


def _holder(tenant: str) -> str:
    return f"Tenant {tenant!r} holds its" if tenant else "Requests without a tenant hold their"
