"""Token verification as a plain function: header, signature, registered claims, principal."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

import jwt
import orjson

from gateway.auth import Principal
from gateway.auth.keys import VerificationKey

MAX_TOKEN_LENGTH = 8192


class TokenError(Exception):
    """The token is unusable; the message is for the log, clients only hear invalid_token."""


@dataclass(frozen=True, slots=True)
class Rules:
    issuer: str
    audience: str
    algorithms: frozenset[str]
    tenant_claim: str
    principal_claim: str
    leeway_s: float


@dataclass(frozen=True, slots=True)
class Verified:
    principal: Principal
    expires_at: float  # the token's exp, seconds since the epoch


def read_header(token: str, rules: Rules) -> tuple[str, str | None]:
    """(alg, kid) of a token whose algorithm is allowed; anything else is a TokenError."""
    if len(token) > MAX_TOKEN_LENGTH:
        raise TokenError("token too long")
    header = _header(token)
    alg, kid = header.get("alg"), header.get("kid")
    if not isinstance(alg, str) or alg not in rules.algorithms:
        raise TokenError(f"algorithm {alg!r} is not allowed")
    if kid is not None and not isinstance(kid, str):
        raise TokenError("kid must be a string")
    return alg, kid


def _header(token: str) -> dict[str, Any]:
    """The JOSE header, decoded here in a few microseconds: pyjwt's reader walks every character
    of the token in Python, and `jwt.decode` below parses (and checks) the token anyway."""
    segments = token.split(".")
    if len(segments) != 3:
        raise TokenError("malformed token: a JWS has three segments")
    encoded = segments[0]
    try:
        raw = base64.b64decode(encoded + "=" * (-len(encoded) % 4), altchars=b"-_", validate=True)
        header = orjson.loads(raw)
    except (binascii.Error, ValueError):
        raise TokenError("malformed token: the header is not base64url JSON") from None
    if not isinstance(header, dict):
        raise TokenError("malformed token: the header is not an object")
    return header


def verify(token: str, key: VerificationKey, rules: Rules) -> Verified:
    """Check signature, iss, aud (taskgate's own resource), exp and nbf with leeway, and read
    the principal; the key decides the one algorithm accepted."""
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key.key,
            algorithms=[key.alg],
            audience=rules.audience,
            issuer=rules.issuer,
            leeway=rules.leeway_s,
            options={"require": ["exp", "iss", "aud"], "verify_signature": True},
        )
    except jwt.PyJWTError as exc:
        raise TokenError(f"{type(exc).__name__}: {exc}") from None
    tenant = claims.get(rules.tenant_claim)
    subject = claims.get(rules.principal_claim)
    if not isinstance(tenant, str) or not tenant:
        raise TokenError(f"claim {rules.tenant_claim!r} is missing or not a string")
    if not isinstance(subject, str) or not subject:
        raise TokenError(f"claim {rules.principal_claim!r} is missing or not a string")
    principal = Principal(tenant=tenant, subject=subject, scopes=_scopes(claims))
    return Verified(principal=principal, expires_at=float(claims["exp"]))


def _scopes(claims: dict[str, Any]) -> frozenset[str]:
    """RFC 8693 `scope` (space-separated) and the common `scp` (a list or a string)."""
    found: set[str] = set()
    for name in ("scope", "scp"):
        value = claims.get(name)
        if isinstance(value, str):
            found.update(value.split())
        elif isinstance(value, list):
            found.update(item for item in value if isinstance(item, str))
    return frozenset(found)
