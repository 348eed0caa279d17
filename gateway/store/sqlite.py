"""Task routes in SQLite (WAL, synchronous=FULL): the embedded single-node store."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from gateway.store.base import Recorded, StoreUnavailable, TaskRoute, now_ms

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
_REFRESH = (
    "UPDATE task_routes SET ttl_ms = ?, expires_at_ms = ? WHERE task_id = ? AND expires_at_ms > ?"
)
_PURGE = """
DELETE FROM task_routes WHERE task_id IN
    (SELECT task_id FROM task_routes WHERE expires_at_ms <= ? LIMIT 1000)
"""
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

    def _select(self, conn: sqlite3.Connection, task_id: str, now: int) -> TaskRoute | None:
        row = conn.execute(_SELECT, (task_id, now)).fetchone()
        return TaskRoute(*row) if row is not None else None

    def _maybe_purge(self, conn: sqlite3.Connection) -> None:
        # Expired rows are invisible already; deleting them in small batches bounds the file.
        if time.monotonic() - self._last_purge >= PURGE_EVERY_S:
            self._last_purge = time.monotonic()
            conn.execute(_PURGE, (now_ms(),))

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
