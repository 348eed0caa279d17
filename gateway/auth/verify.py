"""Token verification as a plain function: header, signature, registered claims, principal."""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any

import jwt
import orjson

from gateway.auth import Principal
from gateway.auth.keys import VerificationKey
from gateway.protocol.envelope import repeats_a_key

MAX_TOKEN_LENGTH = 8192
# RFC 7519 NumericDate: seconds since the epoch, so never negative, and finite. The ceiling is
# 9999-12-31T23:59:59Z + 1 s: no issuer means a lifetime of eight millennia, Python's datetime
# (and many a consumer's) cannot show a later instant, and pyjwt's int() would turn 1e30 or the
# string "9999999999" into a token that never expires.
NUMERIC_DATE_END = 253_402_300_800
TIME_CLAIMS = ("exp", "nbf", "iat")
# C0, DEL and C1: a header writer strips, rejects or mangles them, so a backend reading the
# identity headers would see another value than the one taskgate checks owners against.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


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
    except binascii.Error:
        raise TokenError("malformed token: the header is not base64url JSON") from None
    return strict_object(raw, "header")


def strict_object(raw: bytes, part: str) -> dict[str, Any]:
    """A JSON object of a token (its `part`, header or payload) that repeats no key, at any
    level. pyjwt's parser keeps the last copy of a key, others the first: a token signed with
    two tenants would name a different one to each reader, so such tokens are refused, as
    request bodies are (gateway/protocol/envelope.py)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise TokenError(f"malformed token: the {part} is not JSON") from None
    if not isinstance(value, dict):
        raise TokenError(f"malformed token: the {part} is not an object")
    if repeats_a_key(raw, value):
        raise TokenError(f"malformed token: the {part} repeats the key {_repeated_key(raw)!r}")
    return value


class _Repeated(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> None:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Repeated(key)
        seen.add(key)


def _repeated_key(raw: bytes) -> str:
    """The first key `raw` repeats (for the log; only read once a repeat is known)."""
    try:
        json.loads(raw, object_pairs_hook=_unique_pairs)
    except _Repeated as repeat:
        return repeat.key
    return "?"


def check_time_claims(claims: dict[str, Any]) -> None:
    """TokenError unless each of exp, nbf and iat that is present is a JSON number (not a
    string, not a bool, not null) in [0, NUMERIC_DATE_END)."""
    for name in TIME_CLAIMS:
        if name not in claims:
            continue
        value = claims[name]
        if type(value) is not int and type(value) is not float:
            raise TokenError(f"the token's {name!r} claim is not a JSON number")
        if not 0 <= value < NUMERIC_DATE_END:  # false for NaN and infinities too
            raise TokenError(
                f"the token's {name!r} claim is out of range (a NumericDate is 0 to "
                f"{NUMERIC_DATE_END}, before the year 10000)"
            )


class _StrictJWT(jwt.PyJWT):
    """pyjwt's verifier, with the payload parsed by `strict_object`: pyjwt calls this hook
    (meant for overriding) after the signature is checked and before the claims are, so the
    payload is parsed once, and the claims pyjwt checks are the ones taskgate has read."""

    def _decode_payload(self, decoded: dict[str, Any]) -> dict[str, Any]:
        claims = strict_object(decoded["payload"], "payload")
        check_time_claims(claims)
        return claims


_DECODER = _StrictJWT()


def verify(token: str, key: VerificationKey, rules: Rules) -> Verified:
    """Check signature, iss, aud (taskgate's own resource), exp and nbf with leeway, and read
    the principal; the key decides the one algorithm accepted."""
    try:
        claims: dict[str, Any] = _DECODER.decode(
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
    tenant = identity_claim(claims, rules.tenant_claim)
    subject = identity_claim(claims, rules.principal_claim)
    principal = Principal(tenant=tenant, subject=subject, scopes=_scopes(claims))
    return Verified(principal=principal, expires_at=float(claims["exp"]))


def identity_claim(claims: dict[str, Any], name: str) -> str:
    """The tenant or principal claim `name`, if a backend would receive it as it is: a header
    writer strips surrounding whitespace (" acme" would reach it as "acme", another tenant's
    name) and refuses or mangles control characters. Checked here, once, so that every path
    (the modern one, the 2025-era front door, listen) only ever holds a value that survives."""
    value = claims.get(name)
    if not isinstance(value, str) or not value:
        raise TokenError(f"the token's {name!r} claim is missing, empty or not a string")
    if value != value.strip():
        raise TokenError(f"the token's {name!r} claim has leading or trailing whitespace")
    if _CONTROL.search(value) is not None:
        raise TokenError(f"the token's {name!r} claim holds a control character")
    return value


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
