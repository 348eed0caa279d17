"""The limiter every request asks once: its tenant's and principal's rate, and for a call that
may create a task, their task quotas, in one store call (gateway/store/limits.py).

When the store cannot be asked, rate limits fail open (the request passes, and the refusals
that did not happen are counted as `store_down`) and task quotas fail closed (a call that may
create a task gets 503: its route could not be recorded either). docs/limits.md says why.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass

from gateway.auth import Principal
from gateway.config.limits import LimitsConfig, PrincipalAllowance
from gateway.errors import LimitReached, Retryable, StoreUnavailable
from gateway.limits.policy import Policy, Scope
from gateway.limits.polling import Snapshots
from gateway.protocol.codes import RequestId
from gateway.store.limits import Bucket, Count, LimitStore

log = logging.getLogger("taskgate.limits")

# Tenants the status page names as refused lately, at most; the oldest go first.
RECENT_REFUSALS = 64
_LOG_EVERY_S = 10.0  # the store-down warning, at most this often
LEASE_S = 0.25  # how long tokens leased from a shared store stay usable

_WHAT = {
    "rate_per_s": "requests per second",
    "tasks_per_minute": "task creations per minute",
    "live_tasks": "live tasks",
}


class Limiter:
    """The limits of one configuration on one store; a reload swaps the policy (`reconfigure`)
    and keeps the store, so buckets keep their tokens across it."""

    def __init__(
        self, config: LimitsConfig, principal_defaults: PrincipalAllowance, store: LimitStore
    ) -> None:
        self.policy = Policy(config, principal_defaults)
        self.snapshots = Snapshots(config.polling)  # tasks/get kept to pollIntervalMs
        self._store = store
        # (limit, tenant label) -> refusals; both bounded by the configuration
        self.refusals: Counter[tuple[str, str]] = Counter()
        self.store_down = 0  # asks the store did not answer (rate: passed; quotas: refused)
        # tenant -> (limit, when): who met a limit lately, for the status page
        self.recent: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._warned_at = 0.0
        # (tenant, principal) -> [tokens left, usable until (monotonic), lease size]: tokens a
        # shared store granted this process ahead (see _leased), None with a store of its own
        self._leases: dict[tuple[str, str], list[float]] | None = {} if store.shared else None
        # (tenant, bucket key) -> until (monotonic): a bucket the store found empty, held until
        # it would hold a token again. Only time adds tokens, so a request sooner would be
        # refused as well: it is refused here, and a flood of refused requests costs no store
        # call each (bench/isolation.py measures that).
        self._held: dict[tuple[str, str], float] = {}
        # (tenant, "" or principal) -> [calls left, usable until]: calls that may create a task
        # a shared store's answer lets through without asking it again (see _quota); None with a
        # store of its own
        self._quotas: dict[tuple[str, str], list[float]] | None = {} if store.shared else None
        self._max_tracked = config.max_tracked

    def reconfigure(self, config: LimitsConfig, principal_defaults: PrincipalAllowance) -> None:
        self.policy = Policy(config, principal_defaults)
        self.snapshots.reconfigure(config.polling)
        if self._leases is not None:
            self._leases.clear()  # tokens granted under the old figures
        self._held.clear()  # waits counted under the old figures
        if self._quotas is not None:
            self._quotas.clear()

    async def admit(
        self,
        principal: Principal,
        creates: bool,
        request_id: RequestId | None,
        tool: str | None = None,
    ) -> None:
        """Take the request's tokens, or raise LimitReached naming the limit. `creates`: the
        request may create a task, so the tenant's and principal's task quotas must allow one
        more (they are taken when it is created: `created`). `tool`: the tool a tools/call
        calls, whose rate (limits.tools) applies too."""
        policy = self.policy
        if not policy.any:
            return
        scope = policy.of(principal.tenant)
        rate = scope.requests(principal.subject) if scope.rated else ()
        lease = Lease(principal.tenant, principal.subject, scope.lease)
        if tool is not None and scope.tools:
            found = scope.tools.get(tool)
            if found is not None:  # a lease of its own: its tokens come from its bucket too
                rate = (*rate, found[0])
                lease = Lease(principal.tenant, principal.subject + "\x00" + tool, found[1])
        if creates and scope.creates:
            await self._quota(scope, principal, rate, lease, request_id)
            return
        if not rate:
            return
        leases = self._leases
        if leases is not None:
            await self._leased(leases, scope, lease, rate, request_id)
            return
        self._check_held(scope, principal.tenant, rate, request_id)
        try:
            refused, wait_ms, _, _ = await self._store.take(principal.tenant, rate, ())
        except StoreUnavailable as exc:
            self._store_down(exc)
            return
        if refused:
            raise self._store_refused(scope, principal.tenant, rate, (), refused - 1, wait_ms,
                                      request_id)  # fmt: skip

    async def _quota(
        self,
        scope: Scope,
        principal: Principal,
        rate: tuple[Bucket, ...],
        lease: Lease,
        request_id: RequestId | None,
    ) -> None:
        """A call that may create a task: its rate tokens, and room in its task quotas. With a
        shared store, the answer that found room lets the next calls through without asking,
        up to the room left at each level (the tenant's and the principal's), at most the
        scope's quota_lease, within LEASE_S. Instances and principals each keep their own, so
        with N instances a quota may be passed by at most (N - 1) x quota_lease while they
        spend them (docs/limits.md)."""
        tenant, subject = principal.tenant, principal.subject
        buckets = rate + scope.creations(subject)
        counts = scope.counts(subject)
        quotas = self._quotas
        levels = _levels(buckets, counts, subject)
        if quotas is not None and _spend(quotas, tenant, levels, time.monotonic()):
            leases = self._leases
            if rate and leases is not None:
                await self._leased(leases, scope, lease, rate, request_id)
            return
        self._check_held(scope, tenant, buckets, request_id, counts)
        try:
            refused, wait_ms, _, room = await self._store.take(tenant, buckets, counts)
        except StoreUnavailable as exc:
            self._store_down(exc)
            raise Retryable(
                "taskgate cannot check this tenant's task quota now; retry", request_id=request_id
            ) from None
        if refused:
            raise self._store_refused(scope, tenant, buckets, counts, refused - 1, wait_ms,
                                      request_id)  # fmt: skip
        if quotas is None:
            return
        if len(quotas) >= self._max_tracked:
            quotas.clear()
        until = time.monotonic() + LEASE_S
        for level, left in _room(buckets, counts, room, subject).items():
            calls = min(left - 1, scope.quota_lease)  # this call takes one place
            if calls >= 1:
                quotas[(tenant, level)] = [calls, until]
            else:
                quotas.pop((tenant, level), None)

    async def _leased(
        self,
        leases: dict[tuple[str, str], list[float]],
        scope: Scope,
        holder: Lease,
        buckets: tuple[Bucket, ...],
        request_id: RequestId | None,
    ) -> None:
        """A request's rate tokens from a shared store, a lease at a time: a caller that spent
        its last lease within LEASE_S gets one twice as large (at most the scope's lease, 5% of
        a second's rate), one that did not gets half, so a quiet caller is counted exactly and
        a busy one costs a store call per lease. What a lease leaves unspent is lost after
        LEASE_S: a caller may get slightly less than its rate, never more."""
        tenant = holder.tenant
        key = (tenant, holder.key)
        now = time.monotonic()
        lease = leases.get(key)
        if lease is not None and lease[0] >= 1 and now < lease[1]:
            lease[0] -= 1
            return
        size = 1
        if lease is not None:
            spent = lease[0] < 1 and now < lease[1]
            size = min(holder.cap, int(lease[2]) * 2) if spent else max(1, int(lease[2]) // 2)
        self._check_held(scope, tenant, buckets, request_id)
        try:
            refused, wait_ms, granted, _ = await self._store.take(tenant, buckets, (), size)
        except StoreUnavailable as exc:
            self._store_down(exc)
            return
        if refused:
            raise self._store_refused(scope, tenant, buckets, (), refused - 1, wait_ms,
                                      request_id)  # fmt: skip
        if len(leases) >= self._max_tracked and key not in leases:
            leases.clear()
        leases[key] = [granted - 1, now + LEASE_S, size]

    def _check_held(
        self,
        scope: Scope,
        tenant: str,
        buckets: tuple[Bucket, ...],
        request_id: RequestId | None,
        counts: tuple[Count, ...] = (),
    ) -> None:
        """Raise LimitReached if one of `buckets` or `counts` is held (found full a moment ago,
        and still full)."""
        held = self._held
        if not held:
            return
        now = time.monotonic()
        keys = [bucket.key for bucket in buckets] + [count.key for count in counts]
        for index, item in enumerate(keys):
            key = (tenant, item)
            until = held.get(key)
            if until is None:
                continue
            if now >= until:
                del held[key]
                continue
            name = _limit_name(buckets, counts, index)
            wait_ms = max(1, math.ceil((until - now) * 1000))
            raise self._refused(scope, tenant, name, wait_ms, request_id)

    def _store_refused(
        self,
        scope: Scope,
        tenant: str,
        buckets: tuple[Bucket, ...],
        counts: tuple[Count, ...],
        index: int,
        wait_ms: int,
        request_id: RequestId | None,
    ) -> LimitReached:
        """The store's refusal by the bucket or count at `index`, held for the wait the store
        gave: only time adds a bucket's tokens, and only expiry frees a count's places (a
        reload, which may change either figure, forgets what is held)."""
        held = self._held
        if len(held) >= self._max_tracked:
            held.clear()
        key = buckets[index].key if index < len(buckets) else counts[index - len(buckets)].key
        held[(tenant, key)] = time.monotonic() + wait_ms / 1000
        name = _limit_name(buckets, counts, index)
        return self._refused(scope, tenant, name, wait_ms, request_id)

    async def created(self, tenant: str, principal: str, task_id: str, expires_at_ms: int) -> None:
        """A task of `principal` was created: its creation buckets give a token and its
        counts hold the id until it expires. A store that fails here is logged: the task is
        recorded, the quota errs towards the tenant."""
        scope = self.policy.of(tenant)
        if not scope.creates:
            return
        buckets = scope.creations(principal)
        counts = scope.counts(principal)
        try:
            await self._store.created(tenant, buckets, counts, task_id, expires_at_ms)
        except StoreUnavailable as exc:
            self._store_down(exc)

    def refuse(
        self,
        tenant: str,
        name: str,
        message: str,
        request_id: RequestId | None,
        retry_after_ms: int = 1000,
    ) -> LimitReached:
        """A limit applied elsewhere (streams, polling), counted and remembered like the rest."""
        scope = self.policy.of(tenant)
        self._count(scope, tenant, name)
        return LimitReached(
            message, limit=name, retry_after_ms=retry_after_ms, request_id=request_id
        )

    def counted(self, tenant: str, name: str) -> None:
        """A refusal the coordinator made (limits.*.concurrent)."""
        self._count(self.policy.of(tenant), tenant, name)

    def _refused(
        self, scope: Scope, tenant: str, name: str, wait_ms: int, request_id: RequestId | None
    ) -> LimitReached:
        self._count(scope, tenant, name)
        whose, key = name.split(".", 1)
        if whose == "tools":
            tool = key.removesuffix(".rate_per_s")
            per_s = scope.tools[tool][0].per_ms * 1000
            message = f"This tenant's limit of {per_s:g} calls per second to tool {tool!r}"
        else:
            allowance = scope.tenant if whose == "tenant" else scope.principal
            message = f"This {whose}'s limit of {getattr(allowance, key):g} {_WHAT[key]}"
        return LimitReached(
            f"{message} is reached (limits.{name})",
            limit=name,
            retry_after_ms=wait_ms,
            request_id=request_id,
        )

    def _count(self, scope: Scope, tenant: str, name: str) -> None:
        self.refusals[(name, scope.label)] += 1
        recent = self.recent
        recent[tenant] = (name, time.time())
        recent.move_to_end(tenant)
        if len(recent) > RECENT_REFUSALS:
            recent.popitem(last=False)

    def _store_down(self, exc: StoreUnavailable) -> None:
        self.store_down += 1
        now = time.monotonic()
        if now - self._warned_at >= _LOG_EVERY_S:
            self._warned_at = now
            log.warning(
                "the limits could not ask the store (%s): rate limits pass, quotas fail", exc
            )


@dataclass(frozen=True, slots=True)
class Lease:
    """Whose rate lease a request spends: (tenant, key) in the leases, and its largest size.
    A call to a tool with a rate of its own spends a lease of its own (key: the principal and
    the tool), since its tokens come from that tool's bucket too."""

    tenant: str
    key: str
    cap: int


def _level(key: str, subject: str) -> str:
    """A bucket's or count's level: "" the tenant's, `subject` a principal's."""
    return subject if ":" in key else ""


def _levels(buckets: tuple[Bucket, ...], counts: tuple[Count, ...], subject: str) -> set[str]:
    """The levels whose quotas a call that may create a task must find room in."""
    found = {_level(count.key, subject) for count in counts}
    found.update(_level(bucket.key, subject) for bucket in buckets if bucket.cost == 0)
    return found


def _spend(quotas: dict[tuple[str, str], list[float]], tenant: str, levels: set[str],
           now: float) -> bool:  # fmt: skip
    """One call from each level's quota lease, if every level has one left; else nothing."""
    found = []
    for level in levels:
        lease = quotas.get((tenant, level))
        if lease is None or lease[0] < 1 or now >= lease[1]:
            return False
        found.append(lease)
    for lease in found:
        lease[0] -= 1
    return True


def _room(buckets: tuple[Bucket, ...], counts: tuple[Count, ...], room: tuple[int, ...],
          subject: str) -> dict[str, int]:  # fmt: skip
    """Each level's room for more calls that may create a task: the least of its creation
    buckets' tokens and its counts' places."""
    found: dict[str, int] = {}
    items = [(b.key, b.cost == 0) for b in buckets] + [(c.key, True) for c in counts]
    for (key, quota), left in zip(items, room, strict=True):
        if quota:
            level = _level(key, subject)
            found[level] = min(left, found.get(level, left))
    return found


def _limit_name(buckets: tuple[Bucket, ...], counts: tuple[Count, ...], index: int) -> str:
    """The configuration name of the bucket or count at `index` (buckets first)."""
    key = buckets[index].key if index < len(buckets) else counts[index - len(buckets)].key
    if key[0] == "u":  # a tool's bucket (policy.py): the rest is the tool's name
        return f"tools.{key[1:]}.rate_per_s"
    whose = "principal" if ":" in key else "tenant"
    kind = {"r": "rate_per_s", "c": "tasks_per_minute", "t": "live_tasks"}[key[0]]
    return f"{whose}.{kind}"
