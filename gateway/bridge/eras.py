"""What each replica speaks, as configured or as learned, and taskgate's own session on each
replica of the 2025 era (gateway/bridge/own_session.py).

One entry per configured replica: the book is bounded by the configuration, and a reload
builds a new one (every replica's era is learned again). A replica that could not be reached
is learned again when next asked (it may have been replaced by a server of another era); one
that says it no longer knows taskgate's session gets a new one, once per question.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from gateway.bridge import own_session
from gateway.bridge.era import MODERN, may_be_2025
from gateway.bridge.own_session import Opened, SessionGone
from gateway.upstream.calls import UpstreamCallError, call
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend, Replica

log = logging.getLogger("taskgate.bridge")

# A replica whose era a call could not learn is asked again before a call no sooner than this.
LEARN_AGAIN_S = 5.0


@dataclass(slots=True)
class _Learned:
    era: str | None = None  # MODERN, or the 2025 revision the replica chose; None: not known
    opened: Opened | None = None  # taskgate's own session on it (2025 era only)
    opening: asyncio.Future[Opened] | None = None  # the initialize in flight, shared
    on: tuple[Backend, Replica] | None = None  # where `opened` was opened (its credentials)
    asked_at: float = float("-inf")  # when a call last had to learn it (monotonic)


class Eras:
    """The era of each replica of `backends`, and taskgate's own sessions on them."""

    def __init__(self, pool: Pool, backends: dict[str, Backend], timeout_s: float) -> None:
        self._pool = pool
        self._backends = backends
        self._timeout_s = timeout_s
        # One entry per replica asked about: at most the configured ones.
        self._book: dict[str, _Learned] = {}
        self._background: set[asyncio.Task[None]] = set()  # DELETEs of sessions let go
        self._closed = False

    def speaks_2025(self, backend: Backend, replica: Replica) -> bool:
        """Whether `replica` is to be spoken to in the 2025 era: configured so, or learned."""
        if backend.era != "auto":
            return backend.era == "2025"
        return self._entry(replica).era not in (None, MODERN)

    def _entry(self, replica: Replica) -> _Learned:
        learned = self._book.get(replica.url)
        if learned is None:
            learned = self._book[replica.url] = _Learned()
        return learned

    def unknown(self, backend: Backend, replica: Replica) -> bool:
        """Whether `replica`'s era is to be learned before a call is sent to it: not known, and
        not asked in vain within LEARN_AGAIN_S (a replica that answers neither era is not asked
        before every call; the calls go to it as to a 2026-07-28 server meanwhile)."""
        if backend.era != "auto":
            return False
        learned = self._entry(replica)
        return learned.era is None and time.monotonic() - learned.asked_at >= LEARN_AGAIN_S

    async def learn(self, backend: Backend, replica: Replica) -> bool:
        """Learn `replica`'s era as discovery does (server/discover, then initialize when it
        is refused as a 2025-era server refuses it); whether it speaks the 2025 era. A replica
        that cannot be reached, or refuses both, stays unknown: the call sent to it says why."""
        self._entry(replica).asked_at = time.monotonic()
        try:
            await call(
                self._pool,
                replica,
                "server/discover",
                timeout_s=self._timeout_s,
                headers=backend.credentials,
            )
        except UpstreamCallError as refused:
            if not may_be_2025(refused):
                return False
            try:
                await self.session(backend, replica)
            except UpstreamCallError:
                return False
            return True
        self.learned_modern(replica)
        return False

    def era_of(self, replica: Replica) -> str | None:
        """The revision `replica` was last spoken to in (2026-07-28, or the 2025 revision its
        initialize chose); None before it answered."""
        return self._entry(replica).era

    def stateless(self, replica: Replica) -> Opened | None:
        """taskgate's own session on `replica` when the replica is a stateless 2025-era server
        (its initialize assigned no session): every request there is answered on its own, so
        a caller's call needs no session of its own, only the revision; else None."""
        learned = self._book.get(replica.url)
        opened = None if learned is None else learned.opened
        return opened if opened is not None and not opened.session_id else None

    def capabilities(self, backend: Backend) -> dict[str, Any]:
        """What a 2025-era backend's server declared at initialize, with its settings (its
        replicas are one server: the first that answered taskgate's own session says it); {}
        for a modern backend, or one not reached yet."""
        for replica in backend.replicas:
            learned = self._book.get(replica.url)
            opened = None if learned is None else learned.opened
            if opened is not None and self.speaks_2025(backend, replica):
                declared = opened.result.get("capabilities")
                return declared if isinstance(declared, dict) else {}
        return {}

    def described(self, backend: Backend, replica: Replica) -> str:
        """What `replica` speaks, as the status page and `taskgate check --discover` say it."""
        era = self.era_of(replica)
        if era == MODERN:
            return MODERN
        if era is not None:
            return f"{era} (2025 era: taskgate speaks it in sessions)"
        if backend.era == "auto":
            return "not known yet (era: auto)"
        return f"{backend.era} (configured), not reached yet"

    async def learn_all(self) -> None:
        """Learn the era of every replica not known yet, all at once."""
        await asyncio.gather(
            *(
                self.learn(backend, replica)
                for backend in self._backends.values()
                for replica in backend.replicas
                if self.unknown(backend, replica)
            )
        )

    def learned_modern(self, replica: Replica) -> None:
        learned = self._entry(replica)
        if learned.era != MODERN:
            learned.era = MODERN
            self._drop(learned)

    def forget(self, replica: Replica) -> None:
        """`replica` could not be reached: its era is learned again when next asked."""
        learned = self._entry(replica)
        if learned is not None and learned.opening is None:
            learned.era = None
            learned.opened = None

    async def session(self, backend: Backend, replica: Replica) -> Opened:
        """taskgate's own session on `replica`, opened now when it has none (one initialize
        at a time per replica; the others wait for it). Learns the 2025 era when it opens."""
        learned = self._entry(replica)
        if learned.opened is not None:
            return learned.opened
        if self._closed:  # a reload replaced this catalogue; its requests still finish
            raise UpstreamCallError("taskgate's own sessions of this configuration are closed")
        if learned.opening is None:
            learned.opening = asyncio.ensure_future(self._open(backend, replica, learned))
            learned.opening.add_done_callback(_retrieved)
        return await asyncio.shield(learned.opening)

    async def ask(
        self, backend: Backend, replica: Replica, method: str, params: dict[str, Any]
    ) -> dict[str, Any]:
        """The result of `method` asked on taskgate's own session on `replica`, opened anew
        once when the replica no longer knows it."""
        for attempt in (1, 2):
            opened = await self.session(backend, replica)
            try:
                return await own_session.ask(
                    self._pool,
                    replica,
                    opened,
                    backend.credentials,
                    method,
                    params,
                    self._timeout_s,
                )
            except SessionGone:
                if attempt == 2:
                    raise
                log.info(
                    "backend %r (%s) no longer knows taskgate's session; opening another",
                    backend.name,
                    replica.label,
                )
                learned = self._entry(replica)
                if learned.opened is opened:
                    learned.opened = None
            except UpstreamCallError as failed:
                if failed.status is None:
                    self.forget(replica)
                raise
        raise AssertionError("the loop returns or raises")

    async def close(self) -> None:
        """End every session taskgate opened (each at once, best effort)."""
        self._closed = True
        for learned in self._book.values():
            if learned.opening is not None:
                learned.opening.cancel()
            self._drop(learned)
        await asyncio.gather(*self._background, return_exceptions=True)

    async def _open(self, backend: Backend, replica: Replica, learned: _Learned) -> Opened:
        try:
            opened = await own_session.initialize(
                self._pool, replica, backend.credentials, self._timeout_s
            )
        finally:
            learned.opening = None
        learned.era = opened.version
        learned.opened = opened
        learned.on = (backend, replica)
        return opened

    def _drop(self, learned: _Learned) -> None:
        """End taskgate's session in `learned`, in the background."""
        opened, learned.opened = learned.opened, None
        if opened is not None and learned.on is not None:
            backend, replica = learned.on
            task = asyncio.get_running_loop().create_task(self._end(backend, replica, opened))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _end(self, backend: Backend, replica: Replica, opened: Opened) -> None:
        failed = await own_session.end(
            self._pool, replica, opened, backend.credentials, self._timeout_s
        )
        if failed is not None:
            log.info("ending taskgate's session on %s failed: %s", replica.label, failed)


def _retrieved(done: asyncio.Future[Opened]) -> None:
    if not done.cancelled():
        done.exception()  # its waiters raise it, and none may be left (all cancelled)
