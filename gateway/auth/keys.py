"""Verification keys: from JWK dicts (a JWKS) or PEM files, each bound to one algorithm."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

# The key type each algorithm needs: a token may only be checked with a key of its own kind,
# which rules out algorithm confusion (an RSA public key used as an HMAC secret, say).
_KEY_KINDS: dict[str, tuple[type[Any], str | None]] = {
    "RS256": (rsa.RSAPublicKey, None),
    "RS384": (rsa.RSAPublicKey, None),
    "RS512": (rsa.RSAPublicKey, None),
    "PS256": (rsa.RSAPublicKey, None),
    "ES256": (ec.EllipticCurvePublicKey, "secp256r1"),
    "ES384": (ec.EllipticCurvePublicKey, "secp384r1"),
    "EdDSA": (ed25519.Ed25519PublicKey, None),
}


class UnusableKey(ValueError):
    """A key that cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class VerificationKey:
    kid: str | None
    alg: str
    key: Any  # a cryptography public key, or the bytes of an HS256 secret


def from_jwk(jwk: dict[str, Any]) -> VerificationKey:
    """A key of a JWKS; symmetric (oct) keys are refused: secrets are never published."""
    if jwk.get("kty") == "oct":
        raise UnusableKey("a JWKS may not carry symmetric keys")
    if jwk.get("use") not in (None, "sig"):
        raise UnusableKey(f"key use {jwk.get('use')!r} is not for signatures")
    try:
        parsed = jwt.PyJWK(jwk)
    except (jwt.PyJWKError, jwt.InvalidKeyError) as exc:
        raise UnusableKey(f"unusable JWK: {exc}") from None
    return _checked(VerificationKey(jwk.get("kid"), parsed.algorithm_name, parsed.key))


def from_pem(kid: str, alg: str, path: str | Path) -> VerificationKey:
    try:
        key = load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise UnusableKey(f"key {kid!r}: cannot load a PEM public key from {path}: {exc}") from None
    return _checked(VerificationKey(kid, alg, key))


def from_secret_env(kid: str, name: str) -> VerificationKey:
    secret = os.environ.get(name, "")
    if len(secret) < 32:
        raise UnusableKey(f"key {kid!r}: ${name} must hold an HS256 secret of 32 bytes or more")
    return VerificationKey(kid, "HS256", secret.encode())


def _checked(key: VerificationKey) -> VerificationKey:
    kind = _KEY_KINDS.get(key.alg)
    if kind is None:
        raise UnusableKey(f"key {key.kid!r}: algorithm {key.alg} is not supported")
    key_type, curve = kind
    if not isinstance(key.key, key_type) or (curve and key.key.curve.name != curve):
        raise UnusableKey(f"key {key.kid!r}: not a {key.alg} public key")
    return key


def select(keys: tuple[VerificationKey, ...], kid: str | None, alg: str) -> VerificationKey | None:
    """The one key for this token header: same alg, and the same kid when the token names one."""
    matches = [k for k in keys if k.alg == alg and (kid is None or k.kid == kid)]
    return matches[0] if len(matches) == 1 else None
