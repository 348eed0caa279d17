"""The tasks taskgate runs, in SQLite: a row per task (made_tasks), its answers waiting for the
holder in made_answers; every change a conditional UPDATE in one transaction."""

from __future__ import annotations

from typing import Any

from gateway.store.base import now_ms
from gateway.store.made import (
    CANCELLED,
    FAILED,
    HOLDER_STOPPED,
    INPUT_REQUIRED,
    WORKING,
    MadeTask,
    Quota,
    Renewed,
)
from gateway.store.made_wire import asked_keys, holder_stopped_outcome
from gateway.store.sqlite_db import SQLiteDatabase, immediate

_COLUMNS = (
    "task_id, tenant, principal, backend, tool, status, created_at_ms, updated_at_ms, ttl_ms, "
    "poll_interval_ms, holder, lease_until_ms, status_message, cancel_requested, outcome, inputs"
)
_INSERT = f"INSERT INTO made_tasks ({_COLUMNS}, expires_at_ms) VALUES ({', '.join('?' * 17)})"
_SELECT = f"SELECT {_COLUMNS} FROM made_tasks WHERE task_id = ? AND expires_at_ms > ?"
_SELECT_OWNED = f"{_SELECT} AND tenant = ? AND (? OR principal = ?)"
_COUNT_OWNER = (
    "SELECT COUNT(*) FROM made_tasks WHERE tenant = ? AND principal = ? AND expires_at_ms > ?"
)
_COUNT = "SELECT COUNT(*) FROM made_tasks WHERE expires_at_ms > ?"
_LIVE = f"status IN ('{WORKING}', '{INPUT_REQUIRED}') AND expires_at_ms > ?"
_RENEW = f"UPDATE made_tasks SET lease_until_ms = ? WHERE task_id = ? AND holder = ? AND {_LIVE}"
_CANCEL_FLAG = "SELECT cancel_requested FROM made_tasks WHERE task_id = ?"
_ANSWERS = "SELECT key, answer FROM made_answers WHERE task_id = ?"
_SET_INPUTS = (
    f"UPDATE made_tasks SET status = ?, inputs = ?, updated_at_ms = ? "
    f"WHERE task_id = ? AND holder = ? AND {_LIVE}"
)
_DROP_ANSWER = "DELETE FROM made_answers WHERE task_id = ? AND key = ?"
_ADD_ANSWER = (
    "INSERT INTO made_answers (task_id, key, answer) VALUES (?, ?, ?) "
    "ON CONFLICT (task_id, key) DO NOTHING"
)
_INPUTS = f"SELECT inputs FROM made_tasks WHERE task_id = ? AND status = '{INPUT_REQUIRED}'"
_FINISH = (
    "UPDATE made_tasks SET status = ?, outcome = ?, status_message = ?, updated_at_ms = ?, "
    f"inputs = x'', holder = '' WHERE task_id = ? AND holder = ? AND {_LIVE}"
)
_CANCEL = f"UPDATE made_tasks SET cancel_requested = 1 WHERE task_id = ? AND {_LIVE}"
_CANCEL_LAPSED = (
    f"UPDATE made_tasks SET status = '{CANCELLED}', updated_at_ms = ?, inputs = x'', holder = '' "
    f"WHERE task_id = ? AND lease_until_ms < ? AND {_LIVE}"
)
_LAPSE = (
    f"UPDATE made_tasks SET status = '{FAILED}', outcome = ?, status_message = ?, "
    f"updated_at_ms = ?, inputs = x'', holder = '' WHERE task_id = ? AND lease_until_ms < ? "
    f"AND {_LIVE}"
)
_DROP_ANSWERS = "DELETE FROM made_answers WHERE task_id = ?"


class SQLiteMadeTaskStore:
    """A MadeTaskStore on the route store's SQLiteDatabase (which opens and closes it)."""

    def __init__(self, db: SQLiteDatabase) -> None:
        self._db = db

    async def create(self, task: MadeTask, *, per_principal: int, total: int) -> None:
        await self._db.run(self._create, task, per_principal, total)

    def _create(self, task: MadeTask, per_principal: int, total: int) -> None:
        conn = self._db.connection()
        now = now_ms()
        with immediate(conn):
            owned = conn.execute(_COUNT_OWNER, (task.tenant, task.principal, now)).fetchone()[0]
            if per_principal and owned >= per_principal:
                raise Quota("per principal", per_principal)
            if total and conn.execute(_COUNT, (now,)).fetchone()[0] >= total:
                raise Quota("in total", total)
            conn.execute(_INSERT, (*_row(task), task.expires_at_ms))
        self._db.maybe_purge(conn)

    async def lookup(self, task_id: str) -> MadeTask | None:
        return await self._db.run(self._lookup, task_id)

    def _lookup(self, task_id: str) -> MadeTask | None:
        row = self._db.connection().execute(_SELECT, (task_id, now_ms())).fetchone()
        return _task(row) if row is not None else None

    async def get_owned(self, task_id: str, tenant: str, principal: str | None) -> MadeTask | None:
        parameters = (task_id, now_ms(), tenant, principal is None, principal or "")
        return await self._db.run(self._get_owned, parameters)

    def _get_owned(self, parameters: tuple[str, int, str, bool, str]) -> MadeTask | None:
        row = self._db.connection().execute(_SELECT_OWNED, parameters).fetchone()
        return _task(row) if row is not None else None

    async def renew(self, holder: str, task_ids: list[str], lease_until_ms: int) -> list[Renewed]:
        return await self._db.run(self._renew, holder, task_ids, lease_until_ms)

    def _renew(self, holder: str, task_ids: list[str], lease_until_ms: int) -> list[Renewed]:
        conn = self._db.connection()
        now = now_ms()
        found: list[Renewed] = []
        with immediate(conn):
            for task_id in task_ids:
                if conn.execute(_RENEW, (lease_until_ms, task_id, holder, now)).rowcount != 1:
                    found.append(Renewed(held=False))
                    continue
                cancel = bool(conn.execute(_CANCEL_FLAG, (task_id,)).fetchone()[0])
                answers = {k: bytes(v) for k, v in conn.execute(_ANSWERS, (task_id,))}
                found.append(Renewed(held=True, cancel_requested=cancel, answers=answers))
        return found

    async def set_inputs(
        self, task_id: str, holder: str, inputs: bytes, taken: list[str], now_ms: int
    ) -> bool:
        return await self._db.run(self._set_inputs, task_id, holder, inputs, taken, now_ms)

    def _set_inputs(
        self, task_id: str, holder: str, inputs: bytes, taken: list[str], now: int
    ) -> bool:
        conn = self._db.connection()
        status = INPUT_REQUIRED if inputs else WORKING
        with immediate(conn):
            row = (status, inputs, now, task_id, holder, now)
            if conn.execute(_SET_INPUTS, row).rowcount != 1:
                return False
            conn.executemany(_DROP_ANSWER, [(task_id, key) for key in taken])
        return True

    async def answer(self, task_id: str, answers: dict[str, bytes], expires_at_ms: int) -> None:
        await self._db.run(self._answer, task_id, answers)

    def _answer(self, task_id: str, answers: dict[str, bytes]) -> None:
        conn = self._db.connection()
        with immediate(conn):
            row = conn.execute(_INPUTS, (task_id,)).fetchone()
            if row is None:
                return
            asked = asked_keys(bytes(row[0]))
            rows = [(task_id, key, answer) for key, answer in answers.items() if key in asked]
            conn.executemany(_ADD_ANSWER, rows)

    async def finish(
        self, task_id: str, holder: str, status: str, outcome: bytes, message: str, now_ms: int
    ) -> bool:
        row = (status, outcome, message, now_ms, task_id, holder, now_ms)
        return await self._db.run(self._finish, task_id, row)

    def _finish(self, task_id: str, row: tuple[object, ...]) -> bool:
        conn = self._db.connection()
        with immediate(conn):
            if conn.execute(_FINISH, row).rowcount != 1:
                return False
            conn.execute(_DROP_ANSWERS, (task_id,))
        return True

    async def request_cancel(self, task_id: str, now_ms: int) -> None:
        await self._db.run(self._request_cancel, task_id, now_ms)

    def _request_cancel(self, task_id: str, now: int) -> None:
        conn = self._db.connection()
        with immediate(conn):
            # A task nobody runs any more is cancelled here; a held one by its holder.
            if conn.execute(_CANCEL_LAPSED, (now, task_id, now, now)).rowcount == 0:
                conn.execute(_CANCEL, (task_id, now))

    async def lapse(self, task_id: str, now_ms: int) -> bool:
        row = (holder_stopped_outcome(), HOLDER_STOPPED, now_ms, task_id, now_ms, now_ms)
        return await self._db.run(self._lapse, row)

    def _lapse(self, row: tuple[object, ...]) -> bool:
        return self._db.connection().execute(_LAPSE, row).rowcount == 1

    async def count(self, now_ms: int) -> int:
        return await self._db.run(self._count, now_ms)

    def _count(self, now: int) -> int:
        row = self._db.connection().execute(_COUNT, (now,)).fetchone()
        return int(row[0])


def _row(task: MadeTask) -> tuple[object, ...]:
    return (
        task.task_id, task.tenant, task.principal, task.backend, task.tool, task.status,
        task.created_at_ms, task.updated_at_ms, task.ttl_ms, task.poll_interval_ms, task.holder,
        task.lease_until_ms, task.status_message, int(task.cancel_requested), task.outcome,
        task.inputs,
    )  # fmt: skip


def _task(row: tuple[Any, ...]) -> MadeTask:
    (task_id, tenant, principal, backend, tool, status, created, updated, ttl, poll, holder,
     lease, message, cancel, outcome, inputs) = row  # fmt: skip
    return MadeTask(
        task_id=str(task_id), tenant=str(tenant), principal=str(principal),
        backend=str(backend), tool=str(tool), status=str(status), created_at_ms=int(created),
        updated_at_ms=int(updated), ttl_ms=int(ttl), poll_interval_ms=int(poll),
        holder=str(holder), lease_until_ms=int(lease), status_message=str(message),
        cancel_requested=bool(cancel), outcome=bytes(outcome), inputs=bytes(inputs),
    )  # fmt: skip
