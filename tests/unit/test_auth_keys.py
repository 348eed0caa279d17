"""Keys are bound to one algorithm and kind; verification reads the principal, or refuses."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gateway.auth.keys import (
    UnusableKey,
    VerificationKey,
    from_jwk,
    from_pem,
    from_secret_env,
    select,
)
from gateway.auth.verify import Rules, TokenError, read_header, verify
from tests.support.issuer import AUDIENCE, ISSUER, SigningKey, new_key

RULES = Rules(
    issuer=ISSUER,
    audience=AUDIENCE,
    algorithms=frozenset({"ES256", "RS256", "EdDSA"}),
    tenant_claim="tenant",
    principal_claim="sub",
    leeway_s=30,
)


def pem_of(signing: SigningKey, path: Path) -> Path:
    path.write_bytes(
        signing.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return path


@pytest.mark.parametrize("alg", ["ES256", "RS256", "EdDSA"])
def test_a_pem_key_verifies_tokens_of_its_algorithm(alg: str, tmp_path: Path) -> None:
    signing = SigningKey(alg, new_key(alg))
    key = from_pem(signing.kid, alg, pem_of(signing, tmp_path / "k.pem"))
    token = jwt.encode(
        {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "exp": time.time() + 60,
            "tenant": "t",
            "sub": "s",
            "scope": "a b",
        },
        signing.private,
        algorithm=alg,
    )
    verified = verify(token, key, RULES)
    assert (verified.principal.tenant, verified.principal.subject) == ("t", "s")
    assert verified.principal.scopes == frozenset({"a", "b"})


@pytest.mark.parametrize(
    ("declared", "actual"),
    [("ES256", "RS256"), ("RS256", "ES256"), ("ES384", "ES256"), ("EdDSA", "ES256")],
)
def test_a_key_of_another_kind_than_its_algorithm_is_refused(
    declared: str, actual: str, tmp_path: Path
) -> None:
    signing = SigningKey(actual, new_key(actual))
    with pytest.raises(UnusableKey):
        from_pem("k", declared, pem_of(signing, tmp_path / "k.pem"))


def test_a_jwks_may_not_publish_secrets() -> None:
    with pytest.raises(UnusableKey):
        from_jwk({"kty": "oct", "k": "c2VjcmV0", "kid": "s"})


def test_an_encryption_key_is_not_a_signing_key() -> None:
    signing = SigningKey("ES256", new_key("ES256"))
    with pytest.raises(UnusableKey):
        from_jwk({**signing.jwk(), "use": "enc"})


def test_a_short_hs256_secret_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKGATE_TEST_SECRET", "short")
    with pytest.raises(UnusableKey):
        from_secret_env("k", "TASKGATE_TEST_SECRET")
    monkeypatch.setenv("TASKGATE_TEST_SECRET", "x" * 32)
    assert from_secret_env("k", "TASKGATE_TEST_SECRET").alg == "HS256"


def test_select_needs_one_key_of_the_tokens_algorithm_and_kid() -> None:
    a = VerificationKey("a", "ES256", object())
    b = VerificationKey("b", "ES256", object())
    r = VerificationKey("r", "RS256", object())
    assert select((a, b, r), "a", "ES256") is a
    assert select((a, b, r), "a", "RS256") is None
    assert select((a, b, r), None, "RS256") is r
    assert select((a, b, r), None, "ES256") is None  # ambiguous: no guessing
    assert select((a, b, r), "z", "ES256") is None


@pytest.mark.parametrize("alg", ["none", "HS256", "PS512", None])
def test_algorithms_outside_the_allowlist_are_refused_before_any_key_is_sought(
    alg: str | None,
) -> None:
    import base64
    import json

    header = base64.urlsafe_b64encode(json.dumps({"alg": alg}).encode()).rstrip(b"=").decode()
    with pytest.raises(TokenError):
        read_header(f"{header}.e30.", RULES)


def test_an_oversized_token_is_refused() -> None:
    with pytest.raises(TokenError):
        read_header("a" * 10_000, RULES)


def test_a_curve_mismatch_is_caught_even_with_the_right_family() -> None:
    p384 = ec.generate_private_key(ec.SECP384R1())
    with pytest.raises(UnusableKey):
        from_jwk(
            {
                **jwt.get_algorithm_by_name("ES384").to_jwk(p384.public_key(), as_dict=True),
                "alg": "ES256",
            }
        )
