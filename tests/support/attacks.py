"""Forged and broken bearer tokens, built by hand where PyJWT refuses, and a raw sender that
can put any Authorization headers (none, one, several) on a request."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import jwt
import orjson
from cryptography.hazmat.primitives import serialization
from multidict import CIMultiDict

from tests.support.issuer import SigningKey
from tests.support.mcp import Answer, mcp_headers


def b64url(data: bytes) -> str:
    """base64url without padding, as JWS compact serialisation spells it."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def segment(value: Mapping[str, Any]) -> str:
    return b64url(orjson.dumps(value))


def json_pairs(pairs: Sequence[tuple[str, Any]]) -> bytes:
    """A JSON object written from `pairs` in order, repeats kept: what a dict cannot hold."""
    members = [orjson.dumps(key) + b":" + orjson.dumps(value) for key, value in pairs]
    return b"{" + b",".join(members) + b"}"


def signed_by_hand(key: SigningKey, header: bytes, payload: bytes) -> str:
    """A JWS over exactly these header and payload bytes, with a real signature by `key`: for
    JSON PyJWT would not write (a repeated key), signed as the trusted issuer would."""
    signing_input = f"{b64url(header)}.{b64url(payload)}"
    algorithm = jwt.get_algorithm_by_name(key.alg)
    signature = algorithm.sign(signing_input.encode("ascii"), key.private)
    return f"{signing_input}.{b64url(signature)}"


def hs256_by_hand(header: Mapping[str, Any], payload: Mapping[str, Any], secret: bytes) -> str:
    """An HS256 JWS computed with hmac directly: PyJWT refuses a PEM public key as a secret,
    which is exactly the secret an algorithm-confusion attacker uses."""
    signing_input = f"{segment({**header, 'alg': 'HS256'})}.{segment(payload)}"
    signature = hmac.new(secret, signing_input.encode("ascii"), hashlib.sha256).digest()
    return f"{signing_input}.{b64url(signature)}"


def unsigned(header: Mapping[str, Any], payload: Mapping[str, Any], alg: str = "none") -> str:
    """An `alg: none` token: header and payload, empty signature."""
    return f"{segment({**header, 'alg': alg})}.{segment(payload)}."


def claims_of(token: str) -> dict[str, Any]:
    """The payload of a compact JWS, unverified."""
    payload: dict[str, Any] = orjson.loads(b64url_decode(token.split(".")[1]))
    return payload


def header_of(token: str) -> dict[str, Any]:
    header: dict[str, Any] = orjson.loads(b64url_decode(token.split(".")[0]))
    return header


def tampered(token: str, **changes: Any) -> str:
    """The token with its payload segment rewritten (claims changed) and its signature kept."""
    head, _, signature = token.split(".")
    payload = {**claims_of(token), **changes}
    return f"{head}.{segment(payload)}.{signature}"


def public_pem(key: SigningKey) -> bytes:
    """The PEM (SubjectPublicKeyInfo) of a signing key's public half."""
    return key.private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


async def send(
    http: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, Any],
    *,
    authorization: Sequence[str] = (),
    name_header: bool = True,
) -> Answer:
    """POST a JSON-RPC request with its MCP headers and exactly these Authorization headers
    (repeated when several are given); `name_header=False` leaves Mcp-Name out."""
    headers: CIMultiDict[str] = CIMultiDict(mcp_headers(body["method"], body.get("params", {})))
    if not name_header:
        headers.popall("Mcp-Name", None)
    for value in authorization:
        headers.add("Authorization", value)
    async with http.post(url, data=orjson.dumps(body), headers=headers) as response:
        return Answer(response.status, CIMultiDict(response.headers), await response.read())


def bearer(token: str) -> list[str]:
    return [f"Bearer {token}"]


def headers_but_date(answer: Answer) -> list[tuple[str, str]]:
    """Every response header (lower-cased name, value) except Date, in a stable order."""
    return sorted((k.lower(), v) for k, v in answer.headers.items() if k.lower() != "date")
