"""Tasks taskgate runs itself, for backends without the Tasks extension (a route's `task.mode`):
a tools/call answered with a task of taskgate's making, durable in the store before its id is
returned, its call held by this process under a lease (gateway/tasks/made_holder.py), and its
tasks/get, tasks/update and tasks/cancel answered from the store by any instance.

Their ids begin with MADE_PREFIX, so a task method knows without a read which table to ask; a
backend's task id that begins so is refused when it is created (gateway/tasks/routes.py)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

import orjson

from gateway.auth import Principal
from gateway.config import MadeTasksConfig, RouteTasksConfig
from gateway.errors import Retryable, StoreUnavailable, TaskNotFound
from gateway.protocol.codes import RequestId
from gateway.protocol.tasks import MADE_PREFIX, is_made, valid_task_id
from gateway.store.base import now_ms
from gateway.store.made import LIVE, WORKING, MadeTask, MadeTaskStore, Quota
from gateway.store.made_wire import asked_keys
from gateway.tasks.made_calls import MadeCall, Round
from gateway.tasks.made_holder import Holder
from gateway.tasks.made_shapes import created, detailed
from gateway.tasks.routes import Counted, may_use

log = logging.getLogger("taskgate.made")

# What became of calls and task methods here (taskgate_made_tasks_total, with the holder's):
# created, inline (offer: answered within after_ms), refused (over a bound), store_down (not
# recorded: the retryable error); found and not_found, of task methods.
MADE_OUTCOMES = ("created", "inline", "refused", "store_down", "found", "not_found")
_COMPLETE = {"resultType": "complete"}


class MadeTasks:
    """Creating the tasks taskgate runs, and their task methods."""

    def __init__(
        self,
        store: MadeTaskStore,
        config: MadeTasksConfig,
        *,
        sharing: str = "principal",
        record_timeout_s: float = 2.0,
        instance: str | None = None,
    ) -> None:
        self.store = store
        self.holder = Holder(store, config, instance or secrets.token_hex(8))
        self._share_in_tenant = sharing == "tenant"
        self._record_timeout_s = record_timeout_s
        self.outcomes = dict.fromkeys(MADE_OUTCOMES, 0)
        self.counted: Counted | None = None  # the limits' quotas (gateway/tasks/routes.py)

    def reconfigure(
        self, config: MadeTasksConfig, *, sharing: str, record_timeout_s: float
    ) -> None:
        """A reload's bounds and sharing rule; running tasks go on as they are."""
        self.holder.config = config
        self._share_in_tenant = sharing == "tenant"
        self._record_timeout_s = record_timeout_s

    async def run(
        self,
        settings: RouteTasksConfig,
        backend: str,
        tool: str,
        principal: Principal,
        call: MadeCall,
        request_id: RequestId,
    ) -> Round:
        """The answer to a tools/call the route runs as a task: a created task (`answer`, a
        CreateTaskResult), or with mode offer the call's own answer when it came in time."""
        refused = self.holder.room_for(principal.tenant, principal.subject)
        if refused is not None:
            self.outcomes["refused"] += 1
            raise Retryable(f"taskgate cannot run this call as a task now: {refused}; retry",
                            request_id=request_id, retry_after_s=5)  # fmt: skip
        first = None
        if settings.mode == "offer":
            first = asyncio.create_task(call.round(None, None))
            try:
                done, _ = await asyncio.wait({first}, timeout=settings.after_ms / 1000)
            except asyncio.CancelledError:
                first.cancel()  # the client left before a task existed: nobody would read it
                raise
            if done:
                self.outcomes["inline"] += 1
                return first.result()
        try:
            record = await self._create(settings, backend, tool, principal, request_id)
        except BaseException:
            if first is not None:
                first.cancel()
            raise
        self.holder.hold(record, call, first)
        return Round(answer=created(record))

    async def _create(
        self,
        settings: RouteTasksConfig,
        backend: str,
        tool: str,
        principal: Principal,
        request_id: RequestId,
    ) -> MadeTask:
        now = now_ms()
        record = MadeTask(
            task_id=MADE_PREFIX + secrets.token_urlsafe(24),  # 192 random bits
            tenant=principal.tenant,
            principal=principal.subject,
            backend=backend,
            tool=tool,
            status=WORKING,
            created_at_ms=now,
            updated_at_ms=now,
            ttl_ms=int(settings.ttl_s * 1000),
            poll_interval_ms=settings.poll_interval_ms,
            holder=self.holder.instance,
            lease_until_ms=self.holder.lease_until(),
        )
        bounds = self.holder.config
        try:
            async with asyncio.timeout(self._record_timeout_s):
                await self.store.create(
                    record, per_principal=bounds.max_per_principal, total=bounds.max_total
                )
        except (StoreUnavailable, TimeoutError) as exc:
            # Durable before return: no record, no id (and the call does not run).
            self.outcomes["store_down"] += 1
            log.error("could not record a task taskgate runs: %s", exc)
            raise Retryable(
                "The task could not be recorded, so the call did not run as a task; retry",
                request_id=request_id,
            ) from None
        except Quota as over:
            self.outcomes["refused"] += 1
            setting = "max_per_principal" if over.which == "per principal" else "max_total"
            raise Retryable(
                f"taskgate keeps at most {over.limit} tasks {over.which} "
                f"(tasks.made.{setting}); retry once one has expired",
                request_id=request_id,
                retry_after_s=60,
            ) from None
        self.outcomes["created"] += 1
        if self.counted is not None:
            await self.counted(
                record.tenant, record.principal, record.task_id, record.expires_at_ms
            )
        return record

    async def get(self, task_id: object, principal: Principal, request_id: RequestId) -> Any:
        """tasks/get: the task as the store has it; one whose holder stopped is failed now."""
        record = await self.owned(task_id, principal, request_id)
        shown = await self.snapshot(record.task_id, record.tenant, record.principal, record)
        if shown is None:
            raise TaskNotFound(request_id)  # it expired between the two reads
        return shown

    async def snapshot(
        self, task_id: str, tenant: str, principal: str, record: MadeTask | None = None
    ) -> dict[str, Any] | None:
        """What tasks/get shows of the owner's task (its record, when just read), None once
        it expired; a task whose holder stopped (its lease lapsed) is failed first."""
        if record is None:
            record = await self.store.get_owned(task_id, tenant, principal)
            if record is None:
                return None
        now = now_ms()
        if record.lapsed(now):
            await self.store.lapse(task_id, now)
            record = await self.store.get_owned(task_id, tenant, principal)
            if record is None:
                return None
        return detailed(record)

    async def update(
        self,
        task_id: object,
        principal: Principal,
        responses: dict[str, Any],
        request_id: RequestId,
    ) -> Any:
        """tasks/update: the answers to questions the task asks now are kept for its holder;
        unknown, answered and superseded keys are ignored (EXT)."""
        record = await self.owned(task_id, principal, request_id)
        asked = asked_keys(record.inputs)
        answers = {key: orjson.dumps(value) for key, value in responses.items() if key in asked}
        if answers:
            await self.store.answer(record.task_id, answers, record.expires_at_ms)
        return _COMPLETE

    async def cancel(self, task_id: object, principal: Principal, request_id: RequestId) -> Any:
        """tasks/cancel: the intent recorded for the holder (this process acts on it at once
        when it holds the task); an ended task stays as it ended."""
        record = await self.owned(task_id, principal, request_id)
        if record.status in LIVE:
            await self.store.request_cancel(record.task_id, now_ms())
            self.holder.cancel(record.task_id)
        return _COMPLETE

    async def owned(self, task_id: object, principal: Principal, request_id: RequestId) -> MadeTask:
        """The caller's task; every other case is the same TaskNotFound (as task routes')."""
        if not valid_task_id(task_id) or not is_made(task_id):
            self.outcomes["not_found"] += 1
            raise TaskNotFound(request_id)
        owner = None if self._share_in_tenant else principal.subject
        record = await self.store.get_owned(task_id, principal.tenant, owner)
        if record is None or not self._may_use(principal, record):
            self.outcomes["not_found"] += 1
            raise TaskNotFound(request_id)
        self.outcomes["found"] += 1
        return record

    def _may_use(self, principal: Principal, record: MadeTask) -> bool:
        return may_use(principal, record.tenant, record.principal, self._share_in_tenant)

    async def drain(self, timeout_s: float) -> None:
        await self.holder.drain(timeout_s)
