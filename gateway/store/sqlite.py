"""Task routes and 2025-era sessions in SQLite (WAL, synchronous=FULL): the embedded
single-node store."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from gateway.errors import StoreUnavailable
from gateway.store.base import Recorded, TaskRoute, now_ms
from gateway.store.sessions import (
    LegacySession,
    Opened,
    Opening,
    UpstreamSession,
    decode_record,
    decode_upstream,
    encode_record,
    encode_upstream,
)

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS task_routes (
    task_id       TEXT PRIMARY KEY,
    backend       TEXT NOT NULL,
    replica       TEXT NOT NULL,
    tenant        TEXT NOT NULL,
    principal     TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    ttl_ms        INTEGER,
    expires_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS task_routes_expiry ON task_routes (expires_at_ms);

-- Keyed by owner first: the primary key is the owner's index (its count, its lookups), and an id
-- is one owner's, as in Redis, where the owner is in the key.
CREATE TABLE IF NOT EXISTS legacy_sessions (
    owner         TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    record        BLOB NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (owner, session_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS legacy_sessions_expiry ON legacy_sessions (expires_at_ms);
-- A row per backend, not a field of the record: two bindings at once never overwrite each
-- other, and a session's end or purge takes its upstream sessions with it.
CREATE TABLE IF NOT EXISTS legacy_upstreams (
    owner         TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    backend       TEXT NOT NULL,
    upstream      BLOB NOT NULL,
    PRIMARY KEY (owner, session_id, backend),
    FOREIGN KEY (owner, session_id) REFERENCES legacy_sessions ON DELETE CASCADE
) WITHOUT ROWID;
"""
_COLUMNS = "task_id, backend, replica, tenant, principal, created_at_ms, ttl_ms, expires_at_ms"
# Insert-only: a live row is never touched; an expired one is as good as absent, so it may go.
_INSERT = f"""
INSERT INTO task_routes ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (task_id) DO UPDATE SET
    backend = excluded.backend, replica = excluded.replica, tenant = excluded.tenant,
    principal = excluded.principal, created_at_ms = excluded.created_at_ms,
    ttl_ms = excluded.ttl_ms, expires_at_ms = excluded.expires_at_ms
WHERE task_routes.expires_at_ms <= ?
"""
_SELECT = f"SELECT {_COLUMNS} FROM task_routes WHERE task_id = ? AND expires_at_ms > ?"
# For its owner only (the principal compared unless the 4th parameter is 1): another owner's id
# finds no row, as an absent one does.
_SELECT_OWNED = f"{_SELECT} AND tenant = ? AND (? OR principal = ?)"
_REFRESH = (
    "UPDATE task_routes SET ttl_ms = ?, expires_at_ms = ? WHERE task_id = ? AND expires_at_ms > ?"
)
_PURGE = """
DELETE FROM task_routes WHERE task_id IN
    (SELECT task_id FROM task_routes WHERE expires_at_ms <= ? LIMIT 1000)
"""
_PURGE_SESSIONS = """
DELETE FROM legacy_sessions WHERE (owner, session_id) IN
    (SELECT owner, session_id FROM legacy_sessions WHERE expires_at_ms <= ? LIMIT 1000)
"""
_COUNT_LIVE = "SELECT count(*) FROM legacy_sessions WHERE expires_at_ms > ?"
_COUNT_OWNER = "SELECT count(*) FROM legacy_sessions WHERE owner = ? AND expires_at_ms > ?"
_SESSION_KEY = "WHERE owner = ? AND session_id = ?"
_COUNT_THIS = f"SELECT count(*) FROM legacy_sessions {_SESSION_KEY} AND expires_at_ms > ?"
# Its upstreams go with it (ON DELETE CASCADE).
_DELETE_SESSION = f"DELETE FROM legacy_sessions {_SESSION_KEY}"
# The owner's least recently used first: every use moves a session's expiry forward. The id
# breaks ties, as a sorted set's member does in Redis. The session being opened is not one.
_OLDEST_OF_OWNER = """
SELECT session_id FROM legacy_sessions
WHERE owner = ? AND session_id != ? AND expires_at_ms > ?
ORDER BY expires_at_ms, session_id LIMIT ?
"""
_SELECT_SESSION = """
SELECT s.record, s.expires_at_ms, u.backend, u.upstream
FROM legacy_sessions AS s LEFT JOIN legacy_upstreams AS u USING (owner, session_id)
WHERE s.owner = ? AND s.session_id = ? AND s.expires_at_ms > ?
"""
# The WHERE is what makes it conditional on a live session (and what lets SQLite parse ON
# CONFLICT after a SELECT). DO NOTHING: the first binder of a backend wins, and _BOUND answers it.
_BIND = """
INSERT INTO legacy_upstreams (owner, session_id, backend, upstream)
SELECT owner, session_id, ?, ? FROM legacy_sessions
WHERE owner = ? AND session_id = ? AND expires_at_ms > ?
ON CONFLICT (owner, session_id, backend) DO NOTHING
"""
# Joined to the live session: an upstream row of an expired, not yet purged, one is no answer.
_BOUND = """
SELECT u.upstream
FROM legacy_upstreams AS u JOIN legacy_sessions AS s USING (owner, session_id)
WHERE u.backend = ? AND s.owner = ? AND s.session_id = ? AND s.expires_at_ms > ?
"""
_TOUCH = f"UPDATE legacy_sessions SET expires_at_ms = ? {_SESSION_KEY} AND expires_at_ms > ?"
PURGE_EVERY_S = 60.0


class SQLiteStore:
    """One connection on one worker thread, so the event loop never waits on the disk."""

    def __init__(self, path: str | Path, *, timeout_s: float) -> None:
        self._path = str(path)
        self._timeout_s = timeout_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskgate-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._last_purge = 0.0

    async def open(self) -> None:
        await self._run(self._open)

    def _open(self) -> None:
        if self._path != ":memory:":
            Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self._path, timeout=self._timeout_s, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        # FULL: a route acknowledged to the client survives power loss, not only a crash.
        conn.execute("PRAGMA synchronous=FULL")
        # Per connection, off by default: an ended or purged session's upstreams go with it.
        conn.execute("PRAGMA foreign_keys=ON")
        conn.executescript(_SCHEMA)
        self._conn = conn

    async def record(self, route: TaskRoute) -> Recorded:
        return await self._run(self._record, route)

    def _record(self, route: TaskRoute) -> Recorded:
        conn = self._connection()
        now = now_ms()
        row = (
            route.task_id, route.backend, route.replica, route.tenant, route.principal,
            route.created_at_ms, route.ttl_ms, route.expires_at_ms,
        )  # fmt: skip
        if conn.execute(_INSERT, (*row, now)).rowcount == 1:
            self._maybe_purge(conn)
            return Recorded.INSERTED
        existing = self._select(conn, route.task_id, now)
        if existing is not None and existing.same_owner(route):
            return Recorded.ALREADY
        return Recorded.CONFLICT

    async def lookup(self, task_id: str) -> TaskRoute | None:
        return await self._run(lambda: self._select(self._connection(), task_id, now_ms()))

    async def lookup_owned(
        self, task_id: str, tenant: str, principal: str | None
    ) -> TaskRoute | None:
        parameters = (task_id, now_ms(), tenant, principal is None, principal or "")
        return await self._run(lambda: self._select_owned(self._connection(), parameters))

    def _select_owned(
        self, conn: sqlite3.Connection, parameters: tuple[str, int, str, bool, str]
    ) -> TaskRoute | None:
        row = conn.execute(_SELECT_OWNED, parameters).fetchone()
        return TaskRoute(*row) if row is not None else None

    async def refresh_expiry(self, task_id: str, ttl_ms: int | None, expires_at_ms: int) -> None:
        await self._run(
            lambda: self._connection().execute(_REFRESH, (ttl_ms, expires_at_ms, task_id, now_ms()))
        )

    async def ping(self) -> None:
        await self._run(lambda: self._connection().execute("SELECT 1").fetchone())

    async def close(self) -> None:
        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await self._run(shut)
        self._executor.shutdown(wait=True)

    async def open_session(
        self, session: LegacySession, *, max_per_owner: int, max_total: int
    ) -> Opening:
        return await self._run(self._open_session, session, max_per_owner, max_total)

    def _open_session(self, session: LegacySession, max_per_owner: int, max_total: int) -> Opening:
        conn = self._connection()
        key = (session.owner, session.session_id)
        evicted: list[LegacySession] = []
        # IMMEDIATE: the write lock before the counts, so that no other process (a worker on the
        # same file) opens one between them and the insert: both limits are exact, and what is
        # evicted is evicted only if the insert commits with it.
        with _immediate(conn):
            now = now_ms()
            # The session itself is not counted: opening an id again replaces it.
            this_one = conn.execute(_COUNT_THIS, (*key, now)).fetchone()[0]
            if conn.execute(_COUNT_LIVE, (now,)).fetchone()[0] - this_one >= max_total:
                return Opening(Opened.STORE_FULL)
            held = conn.execute(_COUNT_OWNER, (session.owner, now)).fetchone()[0] - this_one
            if held >= max_per_owner:
                # Room for the new one: more than one only after the limit was lowered.
                excess = held - max_per_owner + 1
                oldest = conn.execute(_OLDEST_OF_OWNER, (*key, now, excess)).fetchall()
                for (session_id,) in oldest:
                    found = self._read_session(conn, session_id, session.owner, now)
                    if found is not None:
                        evicted.append(found)
                    conn.execute(_DELETE_SESSION, (session.owner, session_id))
            conn.execute(_DELETE_SESSION, key)
            conn.execute(
                "INSERT INTO legacy_sessions (owner, session_id, record, expires_at_ms) "
                "VALUES (?, ?, ?, ?)",
                (*key, encode_record(session), session.expires_at_ms),
            )
        self._maybe_purge(conn)
        return Opening(Opened.OPENED, tuple(evicted))

    async def session(self, session_id: str, owner: str) -> LegacySession | None:
        return await self._run(self._session, session_id, owner)

    def _session(self, session_id: str, owner: str) -> LegacySession | None:
        return self._read_session(self._connection(), session_id, owner, now_ms())

    @staticmethod
    def _read_session(
        conn: sqlite3.Connection, session_id: str, owner: str, now: int
    ) -> LegacySession | None:
        # One statement, so one snapshot: the record and its upstreams as they were together.
        rows = conn.execute(_SELECT_SESSION, (owner, session_id, now)).fetchall()
        if not rows:
            return None
        upstreams: dict[str, UpstreamSession] = {}
        for _, _, backend, raw in rows:
            upstream = decode_upstream(raw) if raw is not None else None
            if upstream is not None:
                upstreams[backend] = upstream
        record, expires_at_ms = rows[0][0], rows[0][1]
        return decode_record(session_id, owner, record, expires_at_ms, upstreams)

    async def bind_upstream(
        self, session_id: str, owner: str, backend: str, upstream: UpstreamSession
    ) -> UpstreamSession | None:
        return await self._run(self._bind_upstream, session_id, owner, backend, upstream)

    def _bind_upstream(
        self, session_id: str, owner: str, backend: str, upstream: UpstreamSession
    ) -> UpstreamSession | None:
        conn = self._connection()
        # IMMEDIATE, as open_session: the insert and the read of the winner in one write
        # transaction, so another process on the same file cannot end the session between them.
        with _immediate(conn):
            now = now_ms()
            conn.execute(_BIND, (backend, encode_upstream(upstream), owner, session_id, now))
            row = conn.execute(_BOUND, (backend, owner, session_id, now)).fetchone()
        return decode_upstream(row[0]) if row is not None else None

    async def touch_session(self, session_id: str, owner: str, expires_at_ms: int) -> bool:
        args = (expires_at_ms, owner, session_id)
        return await self._run(
            lambda: self._connection().execute(_TOUCH, (*args, now_ms())).rowcount == 1
        )

    async def end_session(self, session_id: str, owner: str) -> LegacySession | None:
        return await self._run(self._end_session, session_id, owner)

    def _end_session(self, session_id: str, owner: str) -> LegacySession | None:
        conn = self._connection()
        with _immediate(conn):
            found = self._session(session_id, owner)
            # An expired row goes too: it is as good as absent, and None says so.
            conn.execute(_DELETE_SESSION, (owner, session_id))
        return found

    def _select(self, conn: sqlite3.Connection, task_id: str, now: int) -> TaskRoute | None:
        row = conn.execute(_SELECT, (task_id, now)).fetchone()
        return TaskRoute(*row) if row is not None else None

    def _maybe_purge(self, conn: sqlite3.Connection) -> None:
        # Expired rows are invisible already; deleting them in small batches bounds the file.
        if time.monotonic() - self._last_purge >= PURGE_EVERY_S:
            self._last_purge = time.monotonic()
            now = now_ms()
            conn.execute(_PURGE, (now,))
            conn.execute(_PURGE_SESSIONS, (now,))

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreUnavailable("the task store is not open")
        return self._conn

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(self._executor, fn, *args), self._timeout_s * 2
            )
        except TimeoutError:
            raise StoreUnavailable("the task store did not answer in time; retry") from None
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"the task store failed ({type(exc).__name__}); retry") from None


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """A write transaction from its first statement; rolled back when anything in it fails."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
