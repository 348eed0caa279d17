"""From an Authorization header to a Principal, with a bounded cache of verified tokens.

Step 1 of a request, in docs/architecture.md.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

from gateway.auth import ANONYMOUS, Principal
from gateway.auth.keys import VerificationKey
from gateway.auth.metadata import challenge
from gateway.auth.verify import (
    MAX_TOKEN_LENGTH,
    Rules,
    TokenError,
    Verified,
    read_header,
    verify,
)
from gateway.errors import Unauthorized

log = logging.getLogger("taskgate.auth")

# The longest Authorization value a connection remembers: "Bearer ", a token of the longest
# length verified, and some blanks.
MAX_MEMO_BYTES = MAX_TOKEN_LENGTH + 64


class KeySource(Protocol):
    async def find(self, kid: str | None, alg: str) -> VerificationKey | None: ...


class Authenticator(Protocol):
    metadata_url: str | None

    def known(self, authorization: Sequence[str]) -> Principal | None:
        """The caller, when it is known without waiting (a token verified before); None: ask
        `authenticate`, which also says what is wrong. No coroutine per request for the
        common case: a client sends the same token again and again."""
        ...

    async def authenticate(self, authorization: Sequence[str]) -> Principal: ...

    def recall(self, authorization: bytes, memo: object) -> Principal | None:
        """The caller when `authorization` (one raw header value) is the one `memo` was made
        of and still holds: a connection's client sends the same token again and again, and
        comparing the bytes costs less than hashing them for the cache."""
        ...

    def memo(self, authorization: bytes) -> object:
        """What a connection keeps after a request whose token this authenticator knows
        (`known` or `authenticate` said so just now), for `recall`; None: nothing."""
        ...


class Anonymous:
    """`auth: {mode: none}`: every caller is the one anonymous principal."""

    metadata_url: str | None = None

    def known(self, authorization: Sequence[str]) -> Principal | None:
        return ANONYMOUS

    async def authenticate(self, authorization: Sequence[str]) -> Principal:
        return ANONYMOUS

    def recall(self, authorization: bytes, memo: object) -> Principal | None:
        return ANONYMOUS

    def memo(self, authorization: bytes) -> object:
        return None


# Each JWTAuthenticator's number: a memo names the one that made it by number, not by reference,
# so that a connection's memo never keeps a replaced authenticator (and its cache) alive.
_generations = itertools.count(1)


class Remembered:
    """A connection's last token, as its raw header value, and what verifying it proved; made
    by one authenticator, `by` its number (a reload makes another, whose rules it may not
    meet)."""

    __slots__ = ("by", "raw", "verified")

    def __init__(self, raw: bytes, verified: Verified, by: int) -> None:
        self.raw = raw
        self.verified = verified
        self.by = by


class JWTAuthenticator:
    def __init__(
        self, rules: Rules, keys: KeySource, metadata_url: str, *, cache_size: int
    ) -> None:
        self._rules = rules
        self._keys = keys
        self.metadata_url: str | None = metadata_url
        self._cache_size = cache_size
        self._generation = next(_generations)
        # sha256(token) -> what verifying it proved; never used past the token's exp.
        self._verified: OrderedDict[bytes, Verified] = OrderedDict()
        # For /metrics: bearer tokens served from that memory, and those verified anew.
        self.cache_hits = 0
        self.cache_misses = 0

    @property
    def keys(self) -> KeySource:
        return self._keys

    def known(self, authorization: Sequence[str]) -> Principal | None:
        if len(authorization) != 1:
            return None
        digest = _digest(authorization[0])
        return None if digest is None else self._cached(digest)

    def recall(self, authorization: bytes, memo: object) -> Principal | None:
        if (
            not isinstance(memo, Remembered)
            or memo.by != self._generation
            or memo.raw != authorization
        ):
            return None
        verified = memo.verified
        if verified.expires_at <= time.time():
            return None
        self.cache_hits += 1
        return verified.principal

    def memo(self, authorization: bytes) -> object:
        # Only what the cache holds: with token_cache_size 0 every request is verified anew.
        # A value padded past any token's length is not kept (a connection holds at most that).
        if len(authorization) > MAX_MEMO_BYTES:
            return None
        digest = _digest(authorization.decode("utf-8", "surrogateescape"))
        verified = None if digest is None else self._verified.get(digest)
        return None if verified is None else Remembered(authorization, verified, self._generation)

    async def authenticate(self, authorization: Sequence[str]) -> Principal:
        """The verified caller, or Unauthorized (401) with a challenge naming the metadata."""
        if not authorization:
            raise Unauthorized(challenge(self.metadata_url))
        if len(authorization) > 1:
            # Credentials were presented, but two readers could pick different ones.
            raise Unauthorized(challenge(self.metadata_url, error="invalid_token"))
        scheme, _, token = authorization[0].strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized(challenge(self.metadata_url))
        digest = _sha256(token)
        principal = self._cached(digest)
        if principal is not None:
            return principal
        self.cache_misses += 1
        try:
            verified = await self._verify(token)
        except TokenError as exc:
            log.info("refused a bearer token: %s", exc)
            raise Unauthorized(challenge(self.metadata_url, error="invalid_token")) from None
        self._remember(digest, verified)
        return verified.principal

    def _cached(self, digest: bytes) -> Principal | None:
        """What verifying the token of `digest` proved, while it holds (counted as a hit)."""
        cached = self._verified.get(digest)
        if cached is None or cached.expires_at <= time.time():
            return None
        self._verified.move_to_end(digest)
        self.cache_hits += 1
        return cached.principal

    async def _verify(self, token: str) -> Verified:
        alg, kid = read_header(token, self._rules)
        key = await self._keys.find(kid, alg)
        if key is None:
            raise TokenError(f"no {alg} key with kid {kid!r}")
        return verify(token, key, self._rules)

    def _remember(self, digest: bytes, verified: Verified) -> None:
        if self._cache_size <= 0:
            return
        self._verified[digest] = verified
        while len(self._verified) > self._cache_size:
            self._verified.popitem(last=False)


def _sha256(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _digest(authorization: str) -> bytes | None:
    """The cache's key of a bearer token's header value; None when it is not one."""
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return _sha256(token)
