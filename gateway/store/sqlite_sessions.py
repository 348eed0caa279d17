"""2025-era sessions in SQLite: a row per session and one per upstream session, counted per
owner and in all, on the process's one SQLiteDatabase (the route store's)."""

from __future__ import annotations

import sqlite3

from gateway.store.base import now_ms
from gateway.store.sessions import (
    LegacySession,
    Opening,
    OpenOutcome,
    UpstreamSession,
    decode_record,
    decode_upstream,
    encode_record,
    encode_upstream,
)
from gateway.store.sqlite_db import SQLiteDatabase, immediate

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
SELECT s.record, s.expires_at_ms, u.backend, u.upstream, s.log_level
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
_SET_LEVEL = f"UPDATE legacy_sessions SET log_level = ? {_SESSION_KEY} AND expires_at_ms > ?"


class SQLiteSessionStore:
    """A SessionStore on an SQLiteDatabase it shares: it neither opens nor closes the database,
    whose owner (the route store) closes it after this store's last use."""

    def __init__(self, db: SQLiteDatabase) -> None:
        self._db = db

    async def open_session(
        self, session: LegacySession, *, max_per_owner: int, max_total: int
    ) -> Opening:
        return await self._db.run(self._open_session, session, max_per_owner, max_total)

    def _open_session(self, session: LegacySession, max_per_owner: int, max_total: int) -> Opening:
        conn = self._db.connection()
        key = (session.owner, session.session_id)
        evicted: list[LegacySession] = []
        # IMMEDIATE: the write lock before the counts, so that no other process (a worker on the
        # same file) opens one between them and the insert: both limits are exact, and what is
        # evicted is evicted only if the insert commits with it.
        with immediate(conn):
            now = now_ms()
            # The session itself is not counted: opening an id again replaces it.
            this_one = conn.execute(_COUNT_THIS, (*key, now)).fetchone()[0]
            if conn.execute(_COUNT_LIVE, (now,)).fetchone()[0] - this_one >= max_total:
                return Opening(OpenOutcome.STORE_FULL)
            held = conn.execute(_COUNT_OWNER, (session.owner, now)).fetchone()[0] - this_one
            if held >= max_per_owner:
                # Room for the new one: more than one only after the limit was lowered.
                excess = held - max_per_owner + 1
                oldest = conn.execute(_OLDEST_OF_OWNER, (*key, now, excess)).fetchall()
                for (session_id,) in oldest:
                    found = _read_session(conn, session_id, session.owner, now)
                    if found is not None:
                        evicted.append(found)
                    conn.execute(_DELETE_SESSION, (session.owner, session_id))
            conn.execute(_DELETE_SESSION, key)
            conn.execute(
                "INSERT INTO legacy_sessions (owner, session_id, record, expires_at_ms) "
                "VALUES (?, ?, ?, ?)",
                (*key, encode_record(session), session.expires_at_ms),
            )
        self._db.maybe_purge(conn)
        return Opening(OpenOutcome.OPENED, tuple(evicted))

    async def session(self, session_id: str, owner: str) -> LegacySession | None:
        return await self._db.run(self._session, session_id, owner)

    def _session(self, session_id: str, owner: str) -> LegacySession | None:
        return _read_session(self._db.connection(), session_id, owner, now_ms())

    async def bind_upstream(
        self, session_id: str, owner: str, backend: str, upstream: UpstreamSession
    ) -> UpstreamSession | None:
        return await self._db.run(self._bind_upstream, session_id, owner, backend, upstream)

    def _bind_upstream(
        self, session_id: str, owner: str, backend: str, upstream: UpstreamSession
    ) -> UpstreamSession | None:
        conn = self._db.connection()
        # IMMEDIATE, as open_session: the insert and the read of the winner in one write
        # transaction, so another process on the same file cannot end the session between them.
        with immediate(conn):
            now = now_ms()
            conn.execute(_BIND, (backend, encode_upstream(upstream), owner, session_id, now))
            row = conn.execute(_BOUND, (backend, owner, session_id, now)).fetchone()
        return decode_upstream(row[0]) if row is not None else None

    async def touch_session(self, session_id: str, owner: str, expires_at_ms: int) -> bool:
        return await self._db.run(self._touch_session, session_id, owner, expires_at_ms)

    def _touch_session(self, session_id: str, owner: str, expires_at_ms: int) -> bool:
        args = (expires_at_ms, owner, session_id)
        return self._db.connection().execute(_TOUCH, (*args, now_ms())).rowcount == 1

    async def set_log_level(self, session_id: str, owner: str, level: str) -> bool:
        return await self._db.run(self._set_log_level, session_id, owner, level)

    def _set_log_level(self, session_id: str, owner: str, level: str) -> bool:
        args = (level, owner, session_id, now_ms())
        return self._db.connection().execute(_SET_LEVEL, args).rowcount == 1

    async def end_session(self, session_id: str, owner: str) -> LegacySession | None:
        return await self._db.run(self._end_session, session_id, owner)

    def _end_session(self, session_id: str, owner: str) -> LegacySession | None:
        conn = self._db.connection()
        with immediate(conn):
            found = self._session(session_id, owner)
            # An expired row goes too: it is as good as absent, and None says so.
            conn.execute(_DELETE_SESSION, (owner, session_id))
        return found


def _read_session(
    conn: sqlite3.Connection, session_id: str, owner: str, now: int
) -> LegacySession | None:
    # One statement, so one snapshot: the record and its upstreams as they were together.
    rows = conn.execute(_SELECT_SESSION, (owner, session_id, now)).fetchall()
    if not rows:
        return None
    upstreams: dict[str, UpstreamSession] = {}
    for _, _, backend, raw, _ in rows:
        upstream = decode_upstream(raw) if raw is not None else None
        if upstream is not None:
            upstreams[backend] = upstream
    record, expires_at_ms, log_level = rows[0][0], rows[0][1], rows[0][4]
    return decode_record(session_id, owner, record, expires_at_ms, upstreams, log_level)
