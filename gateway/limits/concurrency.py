"""The part of the limits the in-flight table applies (gateway/pipeline/coordinator.py)."""

from __future__ import annotations


class Concurrency:
    """Requests in flight one tenant, and one principal of it, may hold (limits.tenant.concurrent
    and limits.principal.concurrent, with the tenants' overrides), as the process counts them:
    a slot is this process's, so each instance counts its own (docs/limits.md)."""

    __slots__ = ("default", "tenants")

    def __init__(
        self,
        default: tuple[int | None, int | None],
        tenants: dict[str, tuple[int | None, int | None]],
    ) -> None:
        self.default = default  # (a tenant's, a principal's); None: no limit
        self.tenants = tenants  # the tenants whose entry in limits.tenants says otherwise
