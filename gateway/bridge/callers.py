"""The 2025-era sessions taskgate opens for callers on the replicas of the 2025 era: one per
replica, caller (tenant and principal) and declared capability set, never shared across callers.

A 2025 server may keep state per session (a log level, subscriptions, roots, even the tools it
registers because of what the client declared), so a session opened for one caller must never
carry another's calls. A session is opened on the caller's first call that needs it and reused
by its next ones. It is ended (DELETE, in the background) when it is idle and either the least
recently used past its backend's `sessions.max_per_replica`, or unused for `sessions.idle_s`,
or its replica left the configuration; a session with a call in flight is never ended under it.
A stateless server (no Mcp-Session-Id) still costs an initialize per caller, and its record
holds nothing to end. The table lives as long as the process: a reload changes the limits.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.bridge import own_session
from gateway.bridge.own_session import Opened
from gateway.bridge.questions import ASKED_ABOUT, SessionStream
from gateway.bridge.waiting import WaitingCalls
from gateway.errors import Retryable
from gateway.store.base import now_ms
from gateway.upstream.calls import UpstreamCallError
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend, Replica

log = logging.getLogger("taskgate.bridge")

# What a caller declares that a 2025-era server may act on: the rest of a 2026-07-28
# clientCapabilities (`extensions`) means nothing there, and taskgate serves no 2025 tasks.
_NOT_2025 = ("extensions", "tasks")
# The deadline of taskgate's own exchanges on a caller's session: its initialize (the call
# itself has its backend's timeout_s), notifications and DELETE.
SESSION_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Caller:
    """Whose session it is: the verified tenant and principal, and a digest of the capability
    set declared on the request (as a 2025-era client would declare it at initialize)."""

    tenant: str
    principal: str
    capabilities: str


def caller_of(
    tenant: str, principal: str, declared: dict[str, Any]
) -> tuple[Caller, dict[str, Any]]:
    """The caller's key, and the capabilities its session is opened with."""
    capabilities = {k: v for k, v in declared.items() if k not in _NOT_2025}
    digest = hashlib.sha256(orjson.dumps(capabilities, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return Caller(tenant, principal, digest[:32]), capabilities


@dataclass(slots=True)
class _Held:
    opened: Opened
    used_at: float
    in_use: int = 0  # calls in flight on it: it is not ended under them
    stream: SessionStream | None = None  # its GET stream, held while calls that may be asked run
    # A task of the caller's lives in the session until then (wall ms: its route's expiry), so
    # it is never ended before, not even at shutdown (another instance may serve the task).
    pinned_until_ms: int = 0

    @property
    def pinned(self) -> bool:
        return self.pinned_until_ms > now_ms()


@dataclass(slots=True)
class _Table:
    """One replica's sessions, least recently used first."""

    max_sessions: int
    idle_s: float
    held: OrderedDict[Caller, _Held] = field(default_factory=OrderedDict)
    opening: dict[Caller, asyncio.Future[Opened]] = field(default_factory=dict)


class CallerSessions:
    """Every caller's session on the 2025-era replicas of the configured backends."""

    def __init__(
        self, pool: Pool, backends: dict[str, Backend], timeout_s: float = SESSION_TIMEOUT_S
    ) -> None:
        self.pool = pool
        self._timeout_s = timeout_s
        self._backends: dict[str, Backend] = {}
        self._tables: dict[str, _Table] = {}
        # Replicas a reload removed, whose sessions still have calls in flight: each session
        # is ended when its last call releases it, and the table dropped when it is empty.
        self._leaving: dict[str, _Table] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._closed = False
        self.opened = 0  # sessions opened since start (the status page, the tests)
        # Calls held open while their clients answer the server's questions (bridge/asking.py).
        self.waiting = WaitingCalls()
        self.reconfigure(backends)

    def reconfigure(self, backends: dict[str, Backend]) -> None:
        """The backends of a new configuration: their limits from now on; the sessions of
        replicas no longer configured end once idle."""
        replicas = {r.url: b for b in backends.values() for r in b.replicas}
        for url in list(self._tables):
            if url not in replicas:
                gone = self._tables.pop(url)
                for caller, held in list(gone.held.items()):
                    if held.in_use == 0:  # one in use is ended when its last call releases it
                        del gone.held[caller]
                        if not held.pinned:
                            self._end_later(self._replica_at(url), held.opened)
                if gone.held:
                    self._leaving[url] = gone
        self._backends = backends
        for url, backend in replicas.items():
            kept = self._tables.get(url)
            if kept is None:
                self._tables[url] = _Table(backend.sessions_per_replica, backend.session_idle_s)
            else:
                kept.max_sessions = backend.sessions_per_replica
                kept.idle_s = backend.session_idle_s

    async def acquire(
        self,
        replica: Replica,
        caller: Caller,
        capabilities: dict[str, Any],
        client_info: dict[str, Any] | None,
    ) -> Opened:
        """The caller's session on `replica`, opened now when it has none; release() it when
        the call ends. A caller that declared a capability the server may ask about gets the
        session's GET stream held open while its calls run (gateway/bridge/questions.py)."""
        table = self._table(replica)
        now = time.monotonic()
        self._expire(replica, table, now)
        held = table.held.get(caller)
        if held is None:
            pending = table.opening.get(caller)
            if pending is None:
                pending = asyncio.ensure_future(
                    self._open(replica, table, caller, capabilities, client_info)
                )
                pending.add_done_callback(_retrieved)
                table.opening[caller] = pending
            opened = await asyncio.shield(pending)
            held = table.held.get(caller)
            if held is None or held.opened is not opened:  # ended meanwhile (a reload)
                raise Retryable(f"taskgate's session on {replica.label} ended; retry")
        held.used_at = now
        held.in_use += 1
        table.held.move_to_end(caller)
        opened = held.opened
        if (
            held.stream is None
            and opened.session_id
            and any(k in capabilities for k in ASKED_ABOUT)
        ):
            held.stream = SessionStream(
                self.pool,
                replica,
                opened,
                self._credentials(replica),
                self._answer_on(replica, opened),
            )
            try:
                await held.stream.open(self._timeout_s)
            except BaseException:  # the client left meanwhile: the call never starts
                self.release(replica, caller, opened)
                raise
        return opened

    def release(
        self, replica: Replica, caller: Caller, opened: Opened, *, lost: bool = False
    ) -> None:
        """The call on `opened` ended; `lost`: the replica no longer knows the session (it
        answered 404), so the next call opens another."""
        url = replica.url
        table = self._tables.get(url) or self._leaving.get(url)
        held = None if table is None else table.held.get(caller)
        if table is None or held is None or held.opened is not opened:
            return  # lost already, by another call on it
        held.in_use -= 1
        held.used_at = time.monotonic()
        if held.in_use == 0 and held.stream is not None:
            held.stream.close()
            held.stream = None
        if url in self._leaving:  # its replica left the configuration while calls ran
            if held.in_use == 0:
                del table.held[caller]
                if not lost and not held.pinned:
                    self._end_later(replica, opened)
                if not table.held:
                    del self._leaving[url]
        elif lost:
            del table.held[caller]
        else:
            self._evict(replica, table)

    def pin(self, replica: Replica, caller: Caller, opened: Opened, until_ms: int) -> None:
        """A task of the caller's lives in `opened` until `until_ms` (wall time): the session
        is not ended before then (gateway/bridge/tasks.py)."""
        table = self._tables.get(replica.url) or self._leaving.get(replica.url)
        held = None if table is None else table.held.get(caller)
        if held is not None and held.opened is opened:
            held.pinned_until_ms = max(held.pinned_until_ms, until_ms)

    def cancel_later(self, replica: Replica, opened: Opened, request_id: Any, reason: str) -> None:
        """Tell the server that a caller's request ended unanswered (in the 2025 era a
        disconnect is not a cancel): notifications/cancelled on its session."""
        body = orjson.dumps(
            {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": request_id, "reason": reason},
            }
        )
        self.post_later(replica, opened, body)

    def _answer_on(self, replica: Replica, opened: Opened) -> Callable[[bytes], None]:
        def answer(body: bytes) -> None:
            self.post_later(replica, opened, body)

        return answer

    def post_later(self, replica: Replica, opened: Opened, body: bytes) -> None:
        """POST a notification or an answer on a session, in the background (best effort)."""
        headers = self._credentials(replica)
        self._later(own_session.notify(self.pool, replica, opened, headers, body, self._timeout_s))

    def count(self, replica: Replica) -> int:
        """The sessions open on `replica` now."""
        table = self._tables.get(replica.url)
        return 0 if table is None else len(table.held)

    async def close(self) -> None:
        """End every caller's session (best effort), and what runs in the background."""
        self._closed = True
        self.waiting.close()
        for url, table in [*self._tables.items(), *self._leaving.items()]:
            for pending in table.opening.values():
                pending.cancel()
            for held in table.held.values():
                if held.stream is not None:
                    self._later(held.stream.aclose())
                if not held.pinned:  # its tasks outlive this process
                    self._end_later(self._replica_at(url), held.opened)
            table.held.clear()
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    def _table(self, replica: Replica) -> _Table:
        table = self._tables.get(replica.url)
        if table is None or self._closed:
            raise Retryable(
                f"taskgate's configuration no longer has replica {replica.label}; retry"
            )
        return table

    async def _open(
        self,
        replica: Replica,
        table: _Table,
        caller: Caller,
        capabilities: dict[str, Any],
        client_info: dict[str, Any] | None,
    ) -> Opened:
        backend = self._backends[replica.backend]
        headers = {**backend.credentials, **backend.identity(caller.tenant, caller.principal)}
        try:
            opened = await own_session.initialize(
                self.pool,
                replica,
                headers,
                self._timeout_s,
                capabilities=capabilities,
                client_info=client_info,
            )
        except UpstreamCallError as refused:
            if refused.cause is not None:  # not reached, or no answer: as a call's failure
                raise refused.cause from None
            raise Retryable(
                f"Backend {backend.name!r} ({replica.label}) did not open a 2025-era session: "
                f"{refused}; retry"
            ) from None
        finally:
            del table.opening[caller]
        self.opened += 1
        table.held[caller] = _Held(opened, time.monotonic())
        self._evict(replica, table)
        return opened

    def _evict(self, replica: Replica, table: _Table) -> None:
        """End idle sessions, least recently used first, while past the replica's limit."""
        if len(table.held) <= table.max_sessions:
            return
        for caller, held in list(table.held.items()):
            if len(table.held) <= table.max_sessions:
                return
            if held.in_use == 0 and not held.pinned:
                del table.held[caller]
                self._end_later(replica, held.opened)

    def _expire(self, replica: Replica, table: _Table, now: float) -> None:
        """End the sessions unused for idle_s: from the least recently used, stopping at the
        first one used since (the work is bounded by what expired). One holding a live task
        counts as used now."""
        while table.held:
            caller, held = next(iter(table.held.items()))
            if now - held.used_at < table.idle_s or held.in_use:
                return
            if held.pinned:
                held.used_at = now
                table.held.move_to_end(caller)
                continue
            del table.held[caller]
            self._end_later(replica, held.opened)

    def _end_later(self, replica: Replica, opened: Opened) -> None:
        self._later(self._end(replica, opened))

    async def _end(self, replica: Replica, opened: Opened) -> None:
        headers = self._credentials(replica)
        failed = await own_session.end(self.pool, replica, opened, headers, self._timeout_s)
        if failed is not None:
            log.info("ending a 2025-era session on %s failed: %s", replica.label, failed)

    def _replica_at(self, url: str) -> Replica:
        """The configured replica at `url` (its backend's credentials end its sessions)."""
        for backend in self._backends.values():
            found = backend.replica(url)
            if found is not None:
                return found
        return Replica("", url)

    def _credentials(self, replica: Replica) -> dict[str, str]:
        backend = self._backends.get(replica.backend)
        return {} if backend is None else dict(backend.credentials)

    def _later(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _retrieved(done: asyncio.Future[Opened]) -> None:
    if not done.cancelled():
        done.exception()  # its waiters raise it, and none may be left (all cancelled)
