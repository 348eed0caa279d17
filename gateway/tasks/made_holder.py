"""The calls of the tasks this process runs, under their leases: each call in an asyncio task of
its own, one loop that renews every lease (and, while a task waits for answers, reads them
sooner), and the end of each call written to the store by compare-and-set.

A lease the holder cannot renew lapses (store.lease_s): the task is then failed by whoever
reads it, so a holder that comes back finds it no longer its own and stops its call. A call is
started once and never handed over (docs/decisions.md, 44)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import orjson

from gateway.config import MadeTasksConfig
from gateway.errors import StoreUnavailable
from gateway.store.base import now_ms
from gateway.store.made import (
    CANCELLED,
    COMPLETED,
    FAILED,
    HOLDER_STOPPED,
    INPUT_REQUIRED,
    MadeTask,
    MadeTaskStore,
    Renewed,
)
from gateway.store.made_wire import failed_outcome
from gateway.tasks.made_calls import MadeCall, Round

log = logging.getLogger("taskgate.made")

# What became of the tasks this process ran (taskgate_made_tasks_total's outcome label):
# completed (isError true too), failed, cancelled, lost (no longer this holder's: expired, or
# failed by another instance after a lapse), stopped (the drain ran out).
HOLDER_OUTCOMES = ("completed", "failed", "cancelled", "lost", "stopped")
_FINISH_ATTEMPTS = 5
_OUTCOME_ENVELOPE = len(b'{"result":}')


class _Held:
    """One task this process runs: its record, its call, the answers read so far."""

    __slots__ = ("answers", "call", "record", "wake", "why", "work")

    def __init__(self, record: MadeTask, call: MadeCall) -> None:
        self.record = record
        self.call = call
        self.work: asyncio.Task[None] | None = None
        self.answers: dict[str, bytes] = {}
        self.wake = asyncio.Event()
        # Why the work was stopped from outside: "cancel", "lost" or "stopped".
        self.why = ""

    @property
    def owner(self) -> tuple[str, str]:
        return (self.record.tenant, self.record.principal)


class Holder:
    """The tasks this process runs (at most max_running, max_running_per_principal each)."""

    def __init__(self, store: MadeTaskStore, config: MadeTasksConfig, instance: str) -> None:
        self._store = store
        self.config = config
        self.instance = instance
        self.held: dict[str, _Held] = {}
        self._per_owner: dict[tuple[str, str], int] = {}
        self.outcomes = dict.fromkeys(HOLDER_OUTCOMES, 0)
        self.result_bytes = 0  # bytes of final answers this process wrote to the store
        self._waiting: set[str] = set()  # held tasks that wait for answers
        self._stirred = asyncio.Event()  # a task began to wait: read answers sooner
        self._loop: asyncio.Task[None] | None = None
        self._closing = False
        # Told the id of each task whose record this process changed (the listen watches).
        self.on_change: Callable[[str], None] | None = None

    @property
    def waiting(self) -> int:
        """Held tasks that wait for their clients' answers."""
        return len(self._waiting)

    def room_for(self, tenant: str, principal: str) -> str | None:
        """Why this process cannot run one more task for the owner, or None."""
        if self._closing:
            return "this taskgate instance is shutting down"
        if len(self.held) >= self.config.max_running:
            return f"this instance runs {self.config.max_running} tasks (tasks.made.max_running)"
        limit = self.config.max_running_per_principal
        if self._per_owner.get((tenant, principal), 0) >= limit:
            return f"this caller has {limit} tasks running (tasks.made.max_running_per_principal)"
        return None

    def lease_until(self) -> int:
        return now_ms() + int(self.config.lease_s * 1000)

    def hold(self, record: MadeTask, call: MadeCall, first: asyncio.Task[Round] | None) -> None:
        """Run `call` for the task `record` (already in the store, this process its holder);
        `first`: its first round, already under way (route mode offer)."""
        held = _Held(record, call)
        self.held[record.task_id] = held
        owner = held.owner
        self._per_owner[owner] = self._per_owner.get(owner, 0) + 1
        held.work = asyncio.create_task(self._run(held, first))
        if self._loop is None:
            self._loop = asyncio.create_task(self._renewing())

    async def _run(self, held: _Held, first: asyncio.Task[Round] | None) -> None:
        task_id = held.record.task_id
        try:
            told = await (first if first is not None else held.call.round(None, None))
            asked = 0
            while told.inputs is not None:
                asked += 1
                responses = await self._asked(held, asked, told.inputs)
                if responses is None:
                    return  # no longer this holder's task
                told = await held.call.round(responses, told.state)
            await self._finish(held, *_ending(told, held.call))
        except asyncio.CancelledError:
            await self._stopped(held, first)
        except Exception:  # a defect: the task must still end, never stay working
            log.exception("a task's call failed unexpectedly")
            await self._finish(held, FAILED, failed_outcome("taskgate failed running the task"))
        finally:
            self._forget(task_id)

    async def _stopped(self, held: _Held, first: asyncio.Task[Round] | None) -> None:
        """The work was cancelled: by the client's tasks/cancel, by a lost lease, or by the
        end of a drain; the upstream call is closed already (its read was cancelled)."""
        if first is not None and not first.done():
            first.cancel()
        why = held.why or "stopped"
        if why == "lost":
            self.outcomes["lost"] += 1
            return
        with contextlib.suppress(Exception):  # best effort, bounded by its own timeout
            await held.call.stopped()
        if why == "cancel":
            await self._finish(held, CANCELLED, b"", "cancelled at the caller's request")
        else:
            outcome = failed_outcome(HOLDER_STOPPED)
            await self._finish(held, FAILED, outcome, HOLDER_STOPPED, counted="stopped")

    async def _asked(
        self, held: _Held, round_no: int, inputs: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Put the server's questions to the task's client and wait for every answer: the
        questions under keys of the task's own (`<round>.<key>`, never reused), the answers
        back under the server's keys. None when the task is no longer this holder's."""
        task_id = held.record.task_id
        keys = {f"{round_no}.{key}": key for key in inputs}
        open_keys = set(keys)
        taken: list[str] = []
        self._waiting.add(task_id)
        self._stirred.set()
        try:
            while open_keys:
                shown = orjson.dumps({key: inputs[keys[key]] for key in sorted(open_keys)})
                if not await self._store.set_inputs(task_id, self.instance, shown, taken, now_ms()):
                    return None
                held.record.status = INPUT_REQUIRED
                self._changed(task_id)
                while not open_keys & held.answers.keys():
                    held.wake.clear()
                    await held.wake.wait()
                taken = sorted(open_keys & held.answers.keys())
                open_keys.difference_update(taken)
        finally:
            self._waiting.discard(task_id)
        if not await self._store.set_inputs(task_id, self.instance, b"", taken, now_ms()):
            return None
        self._changed(task_id)
        return {server: orjson.loads(held.answers.pop(mine)) for mine, server in keys.items()}

    async def _finish(
        self, held: _Held, status: str, outcome: bytes, message: str = "", counted: str = ""
    ) -> None:
        """Write the task's end (a few tries while the store is away: past the lease it fails
        anyway, HOLDER_STOPPED, and nothing is lost but this answer)."""
        task_id = held.record.task_id
        for attempt in range(_FINISH_ATTEMPTS):
            try:
                mine = await self._store.finish(
                    task_id, self.instance, status, outcome, message, now_ms()
                )
            except StoreUnavailable as exc:
                log.warning("could not write the end of a task (try %d): %s", attempt + 1, exc)
                await asyncio.sleep(min(self.config.lease_s / _FINISH_ATTEMPTS, 2.0))
                continue
            self.outcomes[(counted or status) if mine else "lost"] += 1
            if mine:
                self.result_bytes += len(outcome)
                self._changed(task_id)
            return
        self.outcomes["lost"] += 1

    def _changed(self, task_id: str) -> None:
        if self.on_change is not None:
            self.on_change(task_id)

    def _forget(self, task_id: str) -> None:
        held = self.held.pop(task_id, None)
        if held is None:
            return
        owner = held.owner
        left = self._per_owner.get(owner, 1) - 1
        if left:
            self._per_owner[owner] = left
        else:
            self._per_owner.pop(owner, None)

    async def _renewing(self) -> None:
        """Renew every lease each third of lease_s; while a task waits for answers, read its
        answers every input_poll_ms."""
        lease_every = self.config.lease_s / 3
        loop = asyncio.get_running_loop()
        next_lease = loop.time()
        while self.held or not self._closing:
            now = loop.time()
            ids = list(self.held) if now >= next_lease else sorted(self._waiting)
            if now >= next_lease:
                next_lease = now + lease_every
            if ids:
                await self._renew(ids)
            wait = next_lease - loop.time()
            if self._waiting:
                wait = min(wait, self.config.input_poll_ms / 1000)
            self._stirred.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stirred.wait(), max(wait, 0.0))

    async def _renew(self, ids: list[str]) -> None:
        try:
            found = await self._store.renew(self.instance, ids, self.lease_until())
        except StoreUnavailable as exc:
            log.warning("could not renew the leases of %d tasks: %s", len(ids), exc)
            return
        for task_id, renewed in zip(ids, found, strict=True):
            held = self.held.get(task_id)
            if held is not None:
                self._heard(held, renewed)

    def _heard(self, held: _Held, renewed: Renewed) -> None:
        work = held.work
        if not renewed.held or renewed.cancel_requested:
            if work is not None and not work.done() and not held.why:
                held.why = "cancel" if renewed.held else "lost"
                work.cancel()
            return
        if renewed.answers:
            held.answers.update(renewed.answers)
            held.wake.set()

    def cancel(self, task_id: str) -> None:
        """Stop the call of a task this process holds, its cancel recorded already (another
        instance's cancel reaches it at the next renewal)."""
        held = self.held.get(task_id)
        if held is not None and held.work is not None and not held.work.done() and not held.why:
            held.why = "cancel"
            held.work.cancel()

    async def drain(self, timeout_s: float) -> None:
        """Let the running tasks finish for up to `timeout_s`, then fail the rest
        (HOLDER_STOPPED); stop renewing. New tasks are refused from now on."""
        self._closing = True
        works = [held.work for held in self.held.values() if held.work is not None]
        if works:
            _, pending = await asyncio.wait(works, timeout=timeout_s)
            for held in list(self.held.values()):
                if held.work is not None and not held.work.done():
                    held.why = held.why or "stopped"
                    held.work.cancel()
            if pending:
                await asyncio.wait(pending)
        if self._loop is not None:
            self._stirred.set()
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None


def _ending(told: Round, call: MadeCall) -> tuple[str, bytes, str]:
    """The status, outcome and message a call's last round leaves in its task: a result over
    the route's max_result_bytes fails it, saying so (the read itself stopped not far above)."""
    if told.result is not None:
        outcome = orjson.dumps({"result": told.result})
        if len(outcome) <= call.max_result_bytes + _OUTCOME_ENVELOPE:
            return COMPLETED, outcome, ""
        message = (
            f"the tool's answer is larger than the route's task.max_result_bytes "
            f"({call.max_result_bytes} bytes), so it was not kept"
        )
        return FAILED, failed_outcome(message), message
    error = told.error or {"code": -32603, "message": f"{call.replica.label} gave no answer"}
    said = error.get("message")
    return FAILED, orjson.dumps({"error": error}), said if isinstance(said, str) else ""
