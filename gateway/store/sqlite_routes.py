"""Task routes in SQLite: a row per task, written insert-only, invisible once expired."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gateway.store.base import Recorded, TaskRoute, now_ms
from gateway.store.limits import LocalLimits
from gateway.store.sqlite_db import SQLiteDatabase
from gateway.store.sqlite_made import SQLiteMadeTaskStore
from gateway.store.sqlite_questions import SQLiteQuestionStore
from gateway.store.sqlite_sessions import SQLiteSessionStore

_COLUMNS = (
    "task_id, backend, replica, tenant, principal, created_at_ms, ttl_ms, expires_at_ms, session"
)
# Insert-only: a live row is never touched; an expired one is as good as absent, so it may go.
_INSERT = f"""
INSERT INTO task_routes ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (task_id) DO UPDATE SET
    backend = excluded.backend, replica = excluded.replica, tenant = excluded.tenant,
    principal = excluded.principal, created_at_ms = excluded.created_at_ms,
    ttl_ms = excluded.ttl_ms, expires_at_ms = excluded.expires_at_ms, session = excluded.session
WHERE task_routes.expires_at_ms <= ?
"""
_SELECT = f"SELECT {_COLUMNS} FROM task_routes WHERE task_id = ? AND expires_at_ms > ?"
# For its owner only (the principal compared unless the 4th parameter is 1): another owner's id
# finds no row, as an absent one does.
_SELECT_OWNED = f"{_SELECT} AND tenant = ? AND (? OR principal = ?)"
_REFRESH = (
    "UPDATE task_routes SET ttl_ms = ?, expires_at_ms = ? WHERE task_id = ? AND expires_at_ms > ?"
)


class SQLiteRouteStore:
    """A TaskRouteStore on an SQLiteDatabase of its own: it opens the database (`open`) and
    closes it (`close`); the 2025-era session store of the process shares it (`sessions`)."""

    def __init__(self, path: str | Path, *, timeout_s: float) -> None:
        self._db = SQLiteDatabase(path, timeout_s=timeout_s)
        self._sessions = SQLiteSessionStore(self._db)
        self._questions = SQLiteQuestionStore(self._db)
        self._made = SQLiteMadeTaskStore(self._db)

    def sessions(self) -> SQLiteSessionStore:
        """The 2025-era session store on this store's database (always the same one)."""
        return self._sessions

    def made(self) -> SQLiteMadeTaskStore:
        """The tasks taskgate runs, on this store's database (always the same one)."""
        return self._made

    def limits(self, max_tracked: int) -> LocalLimits:
        """The limits' buckets and counts: in this process, at most `max_tracked` of each."""
        return LocalLimits(max_tracked)

    def questions(self) -> SQLiteQuestionStore:
        """The 2025-era tasks' questions on this store's database (always the same one)."""
        return self._questions

    async def open(self) -> None:
        await self._db.open()

    async def record(self, route: TaskRoute) -> Recorded:
        return await self._db.run(self._record, route)

    def _record(self, route: TaskRoute) -> Recorded:
        conn = self._db.connection()
        now = now_ms()
        row = (
            route.task_id, route.backend, route.replica, route.tenant, route.principal,
            route.created_at_ms, route.ttl_ms, route.expires_at_ms, route.session,
        )  # fmt: skip
        if conn.execute(_INSERT, (*row, now)).rowcount == 1:
            self._db.maybe_purge(conn)
            return Recorded.INSERTED
        existing = _select(conn, route.task_id, now)
        if existing is not None and existing.same_owner(route):
            return Recorded.ALREADY
        return Recorded.CONFLICT

    async def lookup(self, task_id: str) -> TaskRoute | None:
        return await self._db.run(self._lookup, task_id)

    def _lookup(self, task_id: str) -> TaskRoute | None:
        return _select(self._db.connection(), task_id, now_ms())

    async def lookup_owned(
        self, task_id: str, tenant: str, principal: str | None
    ) -> TaskRoute | None:
        parameters = (task_id, now_ms(), tenant, principal is None, principal or "")
        return await self._db.run(self._select_owned, parameters)

    def _select_owned(self, parameters: tuple[str, int, str, bool, str]) -> TaskRoute | None:
        row = self._db.connection().execute(_SELECT_OWNED, parameters).fetchone()
        return TaskRoute(*row) if row is not None else None

    async def refresh_expiry(self, task_id: str, ttl_ms: int | None, expires_at_ms: int) -> None:
        await self._db.run(self._refresh, task_id, ttl_ms, expires_at_ms)

    def _refresh(self, task_id: str, ttl_ms: int | None, expires_at_ms: int) -> None:
        self._db.connection().execute(_REFRESH, (ttl_ms, expires_at_ms, task_id, now_ms()))

    async def ping(self) -> None:
        await self._db.run(self._ping)

    def _ping(self) -> None:
        self._db.connection().execute("SELECT 1").fetchone()

    async def close(self) -> None:
        await self._db.close()


def _select(conn: sqlite3.Connection, task_id: str, now: int) -> TaskRoute | None:
    row = conn.execute(_SELECT, (task_id, now)).fetchone()
    return TaskRoute(*row) if row is not None else None
