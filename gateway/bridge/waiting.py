"""The 2025-era calls of this process that wait for a client's answer, and the requestState
that names one.

A 2025-era server asks its questions (elicitation/create, sampling/createMessage, roots/list)
during a call, on the call's stream, and waits for the answers; a 2026-07-28 client is asked
with `resultType: "input_required"` and answers by calling again (the core's MRTR). Between the
two, the upstream call is held open here (gateway/bridge/rounds.py): in this process, because
the answer of the call arrives on that one connection.

The requestState the client echoes is `tg1.<instance>.<key>.<expiry>.<mac>`: the instance
that holds the call, a random key, the expiry (Unix seconds) and an HMAC-SHA256, under a key
this process draws at start, over those and what the retry must match: the caller's tenant and
principal, the method, and its tool name, prompt name or URI. Each one is good for one retry:
the next question gets a new one. A tampered, expired or used one, or one presented by another
caller or for another request, is refused with one answer, that of a state that does not exist;
one issued by another instance is refused with an answer that says so (docs/backends-2025.md,
"Questions during a call").
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import secrets
import time
from typing import Protocol

from gateway.auth import Principal
from gateway.errors import BadRequestState
from gateway.protocol.codes import RequestId

PREFIX = "tg1."
_MAC_BYTES = 16  # 128 bits: a forgery is a guess at a fresh random value per state
UNKNOWN = (
    "Invalid params: requestState is not one taskgate issued for this request and caller, or "
    "it expired or was used; call again without it"
)


class Parked(Protocol):
    """A held call as the table keeps it: where it runs, and how it ends when no retry comes."""

    @property
    def replica_url(self) -> str: ...

    def end(self, reason: str | None) -> None: ...


class _Entry:
    __slots__ = ("call", "timer")

    def __init__(self, call: Parked, timer: asyncio.TimerHandle) -> None:
        self.call = call
        self.timer = timer


class WaitingCalls:
    """The held calls of this process, each under the key of its current requestState,
    bounded per replica; one no retry claims before its expiry is ended."""

    def __init__(self) -> None:
        self.instance = secrets.token_hex(6)
        self._secret = secrets.token_bytes(32)
        self._entries: dict[str, _Entry] = {}
        self._per_replica: dict[str, int] = {}
        self._closed = False

    def has_room(self, replica_url: str, limit: int) -> bool:
        """Whether one more call on that replica may wait (its backend's
        sessions.max_waiting_per_replica)."""
        return not self._closed and self._per_replica.get(replica_url, 0) < limit

    def park(
        self, call: Parked, principal: Principal, method: str, name: str, wait_s: float
    ) -> str:
        """Hold `call` for `wait_s`; the requestState that claims it."""
        key = secrets.token_urlsafe(18)
        expiry = int(time.time() + wait_s)
        head = f"{PREFIX}{self.instance}.{key}.{expiry}"
        binding = self._mac(head, principal, method, name)
        loop = asyncio.get_running_loop()
        timer = loop.call_later(wait_s, self._expire, key)
        self._entries[key] = _Entry(call, timer)
        url = call.replica_url
        self._per_replica[url] = self._per_replica.get(url, 0) + 1
        return f"{head}.{_b64(binding)}"

    def issued_here(self, state: str) -> bool:
        """Whether `state` names this process (it may still be refused: claim() decides)."""
        return state.startswith(f"{PREFIX}{self.instance}.")

    def claim(
        self, state: str, principal: Principal, method: str, name: str, request_id: RequestId
    ) -> Parked:
        """The call `state` holds, taken out of the table for the retry that presents it;
        BadRequestState when it is not this caller's, this request's, or alive."""
        parts = state.split(".")
        if len(parts) != 5 or not self.issued_here(state):
            raise BadRequestState(UNKNOWN, request_id=request_id)
        head = state.rpartition(".")[0]
        entry = self._entries.get(parts[2])
        expected = self._mac(head, principal, method, name)
        given = parts[4]
        if entry is None or not hmac.compare_digest(given, _b64(expected)):
            raise BadRequestState(UNKNOWN, request_id=request_id)
        self._drop(parts[2], entry)
        return entry.call

    def count(self) -> int:
        """Calls waiting now (the status page, the tests)."""
        return len(self._entries)

    def close(self) -> None:
        """End every waiting call (the process stops)."""
        self._closed = True
        for key, entry in list(self._entries.items()):
            self._drop(key, entry)
            entry.call.end("taskgate is stopping")

    def _expire(self, key: str) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            self._drop(key, entry)
            entry.call.end("no answer came from the client in time")

    def _drop(self, key: str, entry: _Entry) -> None:
        del self._entries[key]
        entry.timer.cancel()
        url = entry.call.replica_url
        left = self._per_replica[url] - 1
        if left:
            self._per_replica[url] = left
        else:
            del self._per_replica[url]

    def _mac(self, head: str, principal: Principal, method: str, name: str) -> bytes:
        # Each field length-prefixed, so that no two different bindings read the same.
        fields = (head, principal.tenant, principal.subject, method, name)
        message = b"".join(len(f.encode()).to_bytes(4, "big") + f.encode() for f in fields)
        return hmac.new(self._secret, message, hashlib.sha256).digest()[:_MAC_BYTES]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
