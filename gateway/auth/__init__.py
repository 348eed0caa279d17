"""Who is calling: the Principal later steps authorize against (docs/architecture.md, step 1)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    """The verified caller; task routes record tenant and subject, task methods check both."""

    tenant: str
    subject: str
    scopes: frozenset[str] = frozenset()


# `auth: {mode: none}`: one anonymous caller, for local development on loopback. Its tenant and
# subject are empty, which no verified token can carry, so tasks created anonymously can never
# be claimed by a token after the same store moves to `mode: jwt`.
ANONYMOUS = Principal(tenant="", subject="")
