"""The SQLite database (WAL, synchronous=FULL) of the embedded single-node store: its one
connection on its one worker thread, the schema of the task routes, the tasks taskgate runs and
the 2025-era sessions, and the purge of their expired rows."""

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
from gateway.store.base import now_ms

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
    expires_at_ms INTEGER NOT NULL,
    session       TEXT NOT NULL DEFAULT ''
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS task_routes_expiry ON task_routes (expires_at_ms);

-- The questions of 2025-era tasks waiting for input (gateway/store/questions.py), a row each.
CREATE TABLE IF NOT EXISTS task_questions (
    task_id       TEXT NOT NULL,
    key           TEXT NOT NULL,
    question      BLOB NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (task_id, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS task_questions_expiry ON task_questions (expires_at_ms);

-- The tasks taskgate runs itself (gateway/store/made.py), a row each; their answers waiting for
-- the holder in made_answers.
CREATE TABLE IF NOT EXISTS made_tasks (
    task_id          TEXT PRIMARY KEY,
    tenant           TEXT NOT NULL,
    principal        TEXT NOT NULL,
    backend          TEXT NOT NULL,
    tool             TEXT NOT NULL,
    status           TEXT NOT NULL,
    created_at_ms    INTEGER NOT NULL,
    updated_at_ms    INTEGER NOT NULL,
    ttl_ms           INTEGER NOT NULL,
    poll_interval_ms INTEGER NOT NULL,
    holder           TEXT NOT NULL,
    lease_until_ms   INTEGER NOT NULL,
    status_message   TEXT NOT NULL,
    cancel_requested INTEGER NOT NULL,
    outcome          BLOB NOT NULL,
    inputs           BLOB NOT NULL,
    expires_at_ms    INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS made_tasks_expiry ON made_tasks (expires_at_ms);
CREATE INDEX IF NOT EXISTS made_tasks_owner ON made_tasks (tenant, principal, expires_at_ms);
CREATE TABLE IF NOT EXISTS made_answers (
    task_id       TEXT NOT NULL,
    key           TEXT NOT NULL,
    answer        BLOB NOT NULL,
    PRIMARY KEY (task_id, key),
    FOREIGN KEY (task_id) REFERENCES made_tasks ON DELETE CASCADE
) WITHOUT ROWID;

-- Keyed by owner first: the primary key is the owner's index (its count, its lookups), and an id
-- is one owner's, as in Redis, where the owner is in the key.
CREATE TABLE IF NOT EXISTS legacy_sessions (
    owner         TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    record        BLOB NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    log_level     TEXT NOT NULL DEFAULT '',
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
_PURGE = """
DELETE FROM task_routes WHERE task_id IN
    (SELECT task_id FROM task_routes WHERE expires_at_ms <= ? LIMIT 1000)
"""
_PURGE_QUESTIONS = """
DELETE FROM task_questions WHERE (task_id, key) IN
    (SELECT task_id, key FROM task_questions WHERE expires_at_ms <= ? LIMIT 1000)
"""
_PURGE_SESSIONS = """
DELETE FROM legacy_sessions WHERE (owner, session_id) IN
    (SELECT owner, session_id FROM legacy_sessions WHERE expires_at_ms <= ? LIMIT 1000)
"""
_PURGE_MADE = """
DELETE FROM made_tasks WHERE task_id IN
    (SELECT task_id FROM made_tasks WHERE expires_at_ms <= ? LIMIT 1000)
"""
PURGE_EVERY_S = 60.0


class SQLiteDatabase:
    """One connection on one worker thread, so the event loop never waits on the disk. The
    route store opens it and closes it; the session store uses the same one."""

    def __init__(self, path: str | Path, *, timeout_s: float) -> None:
        self._path = str(path)
        self._timeout_s = timeout_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskgate-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._last_purge = 0.0

    async def open(self) -> None:
        await self.run(self._open)

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
        _migrate(conn)
        self._conn = conn

    async def close(self) -> None:
        await self.run(self._shut)
        self._executor.shutdown(wait=True)

    def _shut(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def maybe_purge(self, conn: sqlite3.Connection) -> None:
        # Expired rows are invisible already; deleting them in small batches bounds the file.
        if time.monotonic() - self._last_purge >= PURGE_EVERY_S:
            self._last_purge = time.monotonic()
            now = now_ms()
            conn.execute(_PURGE, (now,))
            conn.execute(_PURGE_SESSIONS, (now,))
            conn.execute(_PURGE_QUESTIONS, (now,))
            conn.execute(_PURGE_MADE, (now,))

    def connection(self) -> sqlite3.Connection:
        """The open connection, on the worker thread (in a function `run` runs)."""
        if self._conn is None:
            raise StoreUnavailable("the task store is not open")
        return self._conn

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the worker thread; SQLite's errors and a late answer as
        StoreUnavailable (retryable)."""
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(self._executor, fn, *args), self._timeout_s * 2
            )
        except TimeoutError:
            raise StoreUnavailable("the task store did not answer in time; retry") from None
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"the task store failed ({type(exc).__name__}); retry") from None


# Columns added since the first schema, with what the rows made before them hold: the session of
# a 2025-era task (its routes are modern ones, whose session is ""), the logging level of a
# 2025-era client's session (none set).
_ADDED = (
    ("task_routes", "session", "TEXT NOT NULL DEFAULT ''"),
    ("legacy_sessions", "log_level", "TEXT NOT NULL DEFAULT ''"),
)


def _migrate(conn: sqlite3.Connection) -> None:
    """A database made before a column of _ADDED existed gets it."""
    for table, column, definition in _ADDED:
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if column not in columns:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """A write transaction from its first statement; rolled back when anything in it fails."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
