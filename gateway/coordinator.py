"""The in-process table of in-flight requests (never the durable task routes).

It bounds how many requests run at once, in total and per backend, refusing beyond a bound at
once rather than queueing, and tells readiness when the process is draining. A request enters
once its body has arrived: a client still sending holds a connection, never a slot. In
docs/architecture.md, step 4 takes the slot and step 7 counts it against a backend.
"""

from __future__ import annotations

import time
from collections import Counter

from gateway.errors import Overloaded
from gateway.protocol.codes import RequestId


class Entry:
    """One in-flight request. A plain class made per request, as envelope's messages are (why:
    gateway/protocol/envelope.py)."""

    __slots__ = ("backend", "started")

    def __init__(self, backend: str | None, started: float) -> None:
        self.backend = backend  # None while the request is not routed yet
        self.started = started


class Admission:
    """The context of one admitted request: a plain class, since a generator-based context
    manager costs a measurable share of a request on the hot path."""

    __slots__ = ("_coordinator", "_key")

    def __init__(self, coordinator: Coordinator, key: int) -> None:
        self._coordinator = coordinator
        self._key = key

    def __enter__(self) -> int:
        return self._key

    def __exit__(self, *exc: object) -> None:
        self._coordinator._release(self._key)


class Coordinator:
    def __init__(self, max_in_flight: int, backend_limits: dict[str, int]) -> None:
        self._max = max_in_flight
        self._backend_limits = backend_limits
        self._entries: dict[int, Entry] = {}
        self._per_backend: Counter[str] = Counter()
        self._next = 0
        self.draining = False

    @property
    def in_flight(self) -> int:
        return len(self._entries)

    def per_backend(self) -> dict[str, int]:
        return {name: count for name, count in self._per_backend.items() if count}

    def set_backend_limits(self, limits: dict[str, int]) -> None:
        """A reload's new limits; requests counted against a backend stay counted."""
        self._backend_limits = limits

    def request(self) -> Admission:
        """Admit one downstream request, or raise Overloaded; the entry dies with the block
        (`with coordinator.request() as key:`)."""
        if self.draining:
            raise Overloaded("taskgate is shutting down; retry on another instance")
        if len(self._entries) >= self._max:
            raise Overloaded(f"taskgate is at its limit of {self._max} requests; retry")
        self._next += 1
        key = self._next
        self._entries[key] = Entry(backend=None, started=time.monotonic())
        return Admission(self, key)

    def _release(self, key: int) -> None:
        entry = self._entries.pop(key)
        if entry.backend is not None:
            self._per_backend[entry.backend] -= 1

    def route(self, key: int, backend: str, request_id: RequestId) -> None:
        """Count the request against `backend`, or raise Overloaded when it is at its limit."""
        entry = self._entries[key]
        if entry.backend == backend:
            return
        limit = self._backend_limits.get(backend)
        if limit is not None and self._per_backend[backend] >= limit:
            raise Overloaded(
                f"Backend {backend!r} is at its limit of {limit} calls; retry",
                request_id=request_id,
            )
        if entry.backend is not None:
            self._per_backend[entry.backend] -= 1
        entry.backend = backend
        self._per_backend[backend] += 1
