"""notifications/tasks for the tasks taskgate runs itself: read from the store, never from a
backend. One watch per task, shared by every listen stream of this process that names it; it
reads the task's record at once when this process changed it (its holder says so) and every
`tasks.made.watch_interval_ms` otherwise (another instance holds it), and hands each change to
its watchers until the task ends."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from typing import Any

import orjson

from gateway.errors import StoreUnavailable
from gateway.listen.stream import ListenStream
from gateway.protocol.tasks import TERMINAL
from gateway.tasks.made import MadeTasks

log = logging.getLogger("taskgate.listen")

_DROPPED = ("resultType",)  # tasks/get's field, not the task's


class _Watch:
    """One task's record, read for its watchers."""

    __slots__ = ("digest", "joined", "principal", "task", "task_id", "tenant", "wake", "watchers")

    def __init__(self, task_id: str, tenant: str, principal: str) -> None:
        self.task_id = task_id
        self.tenant = tenant
        self.principal = principal
        self.watchers: set[ListenStream] = set()
        self.joined: set[ListenStream] = set()  # not sent the task's state yet
        self.digest = b""
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def run(self, made: MadeTasks, interval_s: float) -> None:
        while True:
            try:
                snapshot = await made.snapshot(self.task_id, self.tenant, self.principal)
            except StoreUnavailable as exc:
                log.warning("watching a task taskgate runs: %s", exc)
                snapshot = {}
            if snapshot is None:
                return  # expired: nothing more will happen to it
            if snapshot and self._take(snapshot):
                return
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), interval_s)

    def _take(self, result: dict[str, Any]) -> bool:
        """Hand a changed task to every watcher (the unchanged one to those who joined since);
        whether it ended."""
        snapshot = {key: value for key, value in result.items() if key not in _DROPPED}
        kept = {key: value for key, value in snapshot.items() if key != "lastUpdatedAt"}
        moved = hashlib.blake2b(orjson.dumps(kept, option=orjson.OPT_SORT_KEYS), digest_size=16)
        digest = moved.digest()
        owed = self.watchers if digest != self.digest else self.joined
        self.digest = digest
        for listener in owed:
            listener.push_task(self.task_id, snapshot)
        self.joined.clear()
        return snapshot.get("status") in TERMINAL


class MadeWatches:
    """Every watched task taskgate runs, in this process."""

    def __init__(self, made: MadeTasks, interval_s: float) -> None:
        self._made = made
        self.interval_s = interval_s
        self._watches: dict[str, _Watch] = {}
        made.holder.on_change = self.stirred

    def __len__(self) -> int:
        return len(self._watches)

    def watch(self, task_id: str, tenant: str, principal: str, listener: ListenStream) -> None:
        """Tell `listener` of every change of the task (its owner checked already)."""
        watch = self._watches.get(task_id)
        if watch is None or watch.task is None or watch.task.done():
            watch = self._watches[task_id] = _Watch(task_id, tenant, principal)
            watch.task = asyncio.create_task(watch.run(self._made, self.interval_s))
        watch.watchers.add(listener)
        watch.joined.add(listener)
        watch.wake.set()

    def unwatch(self, task_id: str, listener: ListenStream) -> None:
        watch = self._watches.get(task_id)
        if watch is None:
            return
        watch.watchers.discard(listener)
        watch.joined.discard(listener)
        if not watch.watchers:
            del self._watches[task_id]
            if watch.task is not None:
                watch.task.cancel()

    def stirred(self, task_id: str) -> None:
        """This process changed the task: read it now."""
        watch = self._watches.get(task_id)
        if watch is not None:
            watch.wake.set()

    async def close(self) -> None:
        tasks = [w.task for w in self._watches.values() if w.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watches.clear()
