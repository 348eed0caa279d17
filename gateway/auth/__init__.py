"""Step 2: who is calling. JWT verification arrives with the tenancy issue; until then, none."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    """The verified caller; task routes record tenant and subject, task methods check both."""

    tenant: str
    subject: str
    scopes: frozenset[str] = frozenset()


# `auth: {mode: none}`: one anonymous caller, for local development on loopback.
ANONYMOUS = Principal(tenant="-", subject="anonymous")
