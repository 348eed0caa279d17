"""Streams open at once per tenant and per principal, in process (limits.*.listen_streams for
subscriptions/listen, limits.*.session_streams for 2025-era GET streams): a stream is this
process's, as a request slot is."""

from __future__ import annotations

from collections import Counter
from typing import Literal, TypeVar

from gateway.auth import Principal
from gateway.limits.limiter import Limiter
from gateway.protocol.codes import RequestId

K = TypeVar("K")
StreamKind = Literal["listen_streams", "session_streams"]
_WHAT = {"listen_streams": "listen streams", "session_streams": "GET streams"}


class StreamCounts:
    """One kind of stream, counted per tenant and per (tenant, principal) while open."""

    __slots__ = ("_kind", "_limiter", "_principals", "_tenants")

    def __init__(self, kind: StreamKind, limiter: Limiter) -> None:
        self._kind = kind
        self._limiter = limiter
        self._tenants: Counter[str] = Counter()
        self._principals: Counter[tuple[str, str]] = Counter()

    def check(self, principal: Principal, request_id: RequestId | None) -> None:
        """Raise LimitReached when the tenant or the principal has as many open as it may."""
        scope = self._limiter.policy.of(principal.tenant)
        kind = self._kind
        for whose, limit, held in (
            ("tenant", getattr(scope.tenant, kind), self._tenants[principal.tenant]),
            (
                "principal",
                getattr(scope.principal, kind),
                self._principals[(principal.tenant, principal.subject)],
            ),
        ):
            if limit is not None and held >= limit:
                raise self._limiter.refuse(
                    principal.tenant,
                    f"{whose}.{kind}",
                    f"This {whose}'s limit of {limit} open {_WHAT[kind]} is reached "
                    f"(limits.{whose}.{kind}); close one",
                    request_id,
                )

    def take(self, tenant: str, subject: str) -> None:
        self._tenants[tenant] += 1
        self._principals[(tenant, subject)] += 1

    def give_back(self, tenant: str, subject: str) -> None:
        _drop(self._tenants, tenant)
        _drop(self._principals, (tenant, subject))

    def of(self, tenant: str, subject: str) -> int:
        return self._principals[(tenant, subject)]


def _drop(counts: Counter[K], key: K) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]
