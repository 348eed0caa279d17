"""Keys fetched from a JWKS URL: cached, refreshed in the background of requests, and on an
unknown kid at a bounded rate; a failed fetch keeps the keys already known."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import orjson

from gateway.auth.keys import UnusableKey, VerificationKey, from_jwk, select

log = logging.getLogger("taskgate.auth")

FETCH_TIMEOUT_S = 5.0
MAX_JWKS_BYTES = 256 * 1024


class JWKSource:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        *,
        refresh_s: float,
        min_refresh_s: float,
    ) -> None:
        self._session = session
        self._url = url
        self._refresh_s = refresh_s
        self._min_refresh_s = min_refresh_s
        self._keys: tuple[VerificationKey, ...] = ()
        self._fetched_at = float("-inf")
        self._attempted_at = float("-inf")
        self._lock = asyncio.Lock()
        self.refreshes = {"ok": 0, "failed": 0}  # for /metrics

    async def find(self, kid: str | None, alg: str) -> VerificationKey | None:
        if time.monotonic() - self._fetched_at >= self._refresh_s:
            await self._refresh()
        key = select(self._keys, kid, alg)
        if key is None:
            # A key rotated in since the last fetch; at most one fetch per min_refresh_s, so
            # tokens with made-up kids cannot turn into a flood of requests to the issuer.
            await self._refresh()
            key = select(self._keys, kid, alg)
        return key

    async def _refresh(self) -> None:
        async with self._lock:
            now = time.monotonic()
            if now - self._attempted_at < self._min_refresh_s:
                return
            self._attempted_at = now
            try:
                self._keys = await self._fetch()
                self._fetched_at = time.monotonic()
                self.refreshes["ok"] += 1
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                self.refreshes["failed"] += 1
                log.warning("cannot refresh the JWKS (keeping %d keys): %s", len(self._keys), exc)

    async def _fetch(self) -> tuple[VerificationKey, ...]:
        timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
        async with self._session.get(self._url, timeout=timeout, allow_redirects=False) as resp:
            if resp.status != 200:
                raise ValueError(f"the JWKS URL answered HTTP {resp.status}")
            raw = await resp.content.read(MAX_JWKS_BYTES + 1)
        if len(raw) > MAX_JWKS_BYTES:
            raise ValueError("the JWKS is too large")
        document: Any = orjson.loads(raw)
        entries = document.get("keys") if isinstance(document, dict) else None
        if not isinstance(entries, list):
            raise ValueError("the JWKS has no keys list")
        keys = []
        for entry in entries:
            try:
                keys.append(from_jwk(entry if isinstance(entry, dict) else {}))
            except UnusableKey as exc:
                log.warning("skipping a JWKS key: %s", exc)
        return tuple(keys)


class StaticKeys:
    """Keys named in the YAML file."""

    def __init__(self, keys: tuple[VerificationKey, ...]) -> None:
        self._keys = keys

    async def find(self, kid: str | None, alg: str) -> VerificationKey | None:
        return select(self._keys, kid, alg)
