"""The questions of 2025-era tasks in SQLite: a row per question, invisible once its task's
route expired (the database's purge removes them)."""

from __future__ import annotations

from gateway.store.base import now_ms
from gateway.store.sqlite_db import SQLiteDatabase

_ADD = """
INSERT INTO task_questions (task_id, key, question, expires_at_ms) VALUES (?, ?, ?, ?)
ON CONFLICT (task_id, key) DO NOTHING
"""
_SELECT = "SELECT key, question FROM task_questions WHERE task_id = ? AND expires_at_ms > ?"
_DELETE = "DELETE FROM task_questions WHERE task_id = ? AND key = ?"


class SQLiteQuestionStore:
    """A TaskQuestions on the route store's SQLiteDatabase (which opens and closes it)."""

    def __init__(self, db: SQLiteDatabase) -> None:
        self._db = db

    async def add_questions(
        self, task_id: str, questions: dict[str, bytes], expires_at_ms: int
    ) -> None:
        rows = [(task_id, key, question, expires_at_ms) for key, question in questions.items()]
        if rows:
            await self._db.run(self._add, rows)

    def _add(self, rows: list[tuple[str, str, bytes, int]]) -> None:
        self._db.connection().executemany(_ADD, rows)

    async def questions(self, task_id: str) -> dict[str, bytes]:
        return await self._db.run(self._questions, task_id)

    def _questions(self, task_id: str) -> dict[str, bytes]:
        rows = self._db.connection().execute(_SELECT, (task_id, now_ms())).fetchall()
        return {key: bytes(question) for key, question in rows}

    async def answered(self, task_id: str, keys: list[str]) -> None:
        if keys:
            await self._db.run(self._answered, task_id, keys)

    def _answered(self, task_id: str, keys: list[str]) -> None:
        self._db.connection().executemany(_DELETE, [(task_id, key) for key in keys])
