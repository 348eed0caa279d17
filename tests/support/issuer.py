"""A real token issuer for tests: keys made here, a JWKS served on loopback, rotation."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import jwt
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

ISSUER = "https://idp.test"
AUDIENCE = "https://gateway.test/mcp"
_kids = itertools.count(1)

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


def new_key(alg: str) -> PrivateKey:
    if alg == "ES256":
        return ec.generate_private_key(ec.SECP256R1())
    if alg == "RS256":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if alg == "EdDSA":
        return ed25519.Ed25519PrivateKey.generate()
    raise ValueError(alg)


@dataclass
class SigningKey:
    alg: str
    private: PrivateKey
    kid: str = field(default_factory=lambda: f"k{next(_kids)}")

    def jwk(self) -> dict[str, Any]:
        algorithm = jwt.get_algorithm_by_name(self.alg)
        jwk: dict[str, Any] = algorithm.to_jwk(self.private.public_key(), as_dict=True)
        return {**jwk, "kid": self.kid, "alg": self.alg, "use": "sig"}


@dataclass
class Issuer:
    """Signs tokens and publishes the public halves of its current keys as a JWKS."""

    keys: list[SigningKey]
    jwks_url: str = ""
    fetches: int = 0

    def token(
        self,
        tenant: str | None = "acme",
        subject: str | None = "alice",
        *,
        scopes: tuple[str, ...] = (),
        key: SigningKey | None = None,
        lifetime_s: float = 300,
        headers: dict[str, Any] | None = None,
        **claims: Any,
    ) -> str:
        """A token as the issuer would sign it; keyword claims override (None removes one)."""
        now = time.time()
        payload: dict[str, Any] = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "iat": int(now),
            "exp": int(now + lifetime_s),
            "tenant": tenant,
            "sub": subject,
        }
        if scopes:
            payload["scope"] = " ".join(scopes)
        payload.update(claims)
        payload = {k: v for k, v in payload.items() if v is not None}
        signer = key or self.keys[0]
        return jwt.encode(
            payload,
            signer.private,
            algorithm=signer.alg,
            headers={"kid": signer.kid, **(headers or {})},
        )

    def rotate(self, alg: str = "ES256") -> SigningKey:
        """A new key becomes the signing key; the old ones stay published until dropped."""
        fresh = SigningKey(alg, new_key(alg))
        self.keys.insert(0, fresh)
        return fresh

    def document(self) -> dict[str, Any]:
        return {"keys": [key.jwk() for key in self.keys]}


def jwt_auth(issuer: Issuer, **overrides: Any) -> dict[str, Any]:
    """The `auth:` section of a taskgate configuration trusting `issuer`."""
    return {
        "mode": "jwt",
        "issuer": ISSUER,
        "audience": AUDIENCE,
        "jwks_url": issuer.jwks_url,
        "algorithms": ["ES256", "RS256", "EdDSA"],
        "jwks_min_refresh_s": 0,
        "resource_metadata": {
            "authorization_servers": [ISSUER],
            "scopes_supported": ["tasks", "reports"],
        },
        **overrides,
    }


@asynccontextmanager
async def running_issuer(*algs: str) -> AsyncIterator[Issuer]:
    """An issuer with one key per algorithm, its JWKS on a loopback port."""
    issuer = Issuer(keys=[SigningKey(alg, new_key(alg)) for alg in algs or ("ES256",)])

    async def jwks(request: web.Request) -> web.Response:
        issuer.fetches += 1
        return web.json_response(issuer.document())

    app = web.Application()
    app.router.add_get("/jwks.json", jwks)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    issuer.jwks_url = str(server.make_url("/jwks.json"))
    try:
        yield issuer
    finally:
        await server.close()
