"""A 2025-era task's questions, as the Tasks extension's `input_required` and `tasks/update`.

A 2025-11-25 server asks during a task by queueing its request for the task's `tasks/result`
stream: it delivers each queued request once, to whichever tasks/result takes it, then waits
for the answer, POSTed on the task's session (the TypeScript SDK 1.x's side channel). So when a
task says `input_required`, the instance that sees it reads the task's tasks/result stream (a
reader, kept until the stream ends: the task ended, or its route expired), and keeps each
question in the store (gateway/store/questions.py) under a key made of the server's request
id; every instance's tasks/get names the questions kept, and its tasks/update POSTs the
answers under the server's ids and forgets them. Two instances reading at once split the queue
between them and both keep what they read: nothing is lost, and a question is kept once.

Bounds: at most MAX_READERS readers per process, each one upstream connection whose answer is
read as it comes (each event at most MAX_EVENT_BYTES).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import orjson

from gateway.bridge.own_session import Opened, notify
from gateway.errors import BadGateway, GatewayError
from gateway.protocol.sse import FrameTooLarge, SSEDecoder
from gateway.store.base import TaskRoute, now_ms
from gateway.store.questions import TaskQuestions
from gateway.upstream.framing import ExchangeError
from gateway.upstream.pool import Pool
from gateway.upstream.relay import EVENT_STREAM, MAX_EVENT_BYTES, content_type, header_lines, send
from gateway.upstream.replicas import Replica

log = logging.getLogger("taskgate.bridge")

MAX_READERS = 256
# While a task says input_required and no question is kept yet, the store is read again after
# POLL_FIRST_S, then twice as long each time, at most POLL_MAX_S apart.
POLL_FIRST_S = 0.05
POLL_MAX_S = 0.5
# A tasks/get waits at most this long (and at most its backend's task_timeout_s) for the first
# question of a task that says input_required: a read, it must not hang on a server that asks
# elsewhere; the next poll finds what came later.
FIRST_WAIT_S = 2.0
_ids = itertools.count(1)
_JSON = "application/json"
_ACCEPT = "application/json, text/event-stream"
RELATED_TASK = "io.modelcontextprotocol/related-task"


class TaskGone(Exception):
    """The server no longer knows the task (it expired it, or its session is gone): the
    client's answer is that of a task that does not exist."""


class TaskInput:
    """The readers of this process, and the questions in the store."""

    def __init__(self, pool: Pool, store: TaskQuestions) -> None:
        self.pool = pool
        self.store = store
        self._readers: dict[str, _Reader] = {}

    async def outstanding(
        self,
        replica: Replica,
        opened: Opened,
        route: TaskRoute,
        headers: dict[str, str],
        timeout_s: float,
    ) -> dict[str, Any]:
        """The `inputRequests` of a task that says input_required: the questions kept; a
        reader started when this process has none for it, and its first question waited
        for (at most FIRST_WAIT_S, and `timeout_s`) when none is kept yet."""
        kept = await self.store.questions(route.task_id)
        reader = self._readers.get(route.task_id)
        if reader is None and len(self._readers) < MAX_READERS:
            reader = _Reader(self, replica, opened, route, headers)
            self._readers[route.task_id] = reader
            reader.start()
        if not kept and reader is not None:
            kept = await self._first(reader, route.task_id, min(timeout_s, FIRST_WAIT_S))
        return {key: _as_request(question) for key, question in sorted(kept.items())}

    async def _first(self, reader: _Reader, task_id: str, timeout_s: float) -> dict[str, bytes]:
        """The questions once some are kept, by this process's reader or another's (a server
        hands each question to one tasks/result only, maybe another instance's), or none after
        `timeout_s`: the store is read again at each of this reader's questions, and at least
        every POLL_MAX_S."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        wait_s = POLL_FIRST_S
        kept: dict[str, bytes] = {}
        while not kept and loop.time() < deadline:
            await reader.first(min(wait_s, max(deadline - loop.time(), 0.0)))
            wait_s = min(wait_s * 2, POLL_MAX_S)
            kept = await self.store.questions(task_id)
            if reader.ended:
                break
        return kept

    async def answer(
        self,
        replica: Replica,
        opened: Opened,
        route: TaskRoute,
        headers: dict[str, str],
        responses: dict[str, Any],
        timeout_s: float,
    ) -> None:
        """POST each answer under the server's id of its question; a key not kept (unknown,
        answered already) is left alone, as the extension has a server do."""
        kept = await self.store.questions(route.task_id)
        answered = []
        for key, response in responses.items():
            question = kept.get(key)
            if question is None:
                continue
            server_id = orjson.loads(question).get("id")
            body = orjson.dumps({"jsonrpc": "2.0", "id": server_id, "result": response})
            status = await notify(self.pool, replica, opened, headers, body, timeout_s)
            if status == 404:
                raise TaskGone
            if status is None or not 200 <= status < 300:
                raise BadGateway(
                    f"Bad gateway: {replica.label} did not take the answer to the task's "
                    f"question (HTTP {status or 'unreachable'})"
                )
            answered.append(key)
        await self.store.answered(route.task_id, answered)

    async def close(self) -> None:
        """Stop every reader (the process stops; another instance reads on from the store)."""
        readers = list(self._readers.values())
        for reader in readers:
            reader.stop()
        await asyncio.gather(*(r.done() for r in readers), return_exceptions=True)

    @property
    def readers(self) -> int:
        """Tasks whose tasks/result stream this process reads now (/metrics)."""
        return len(self._readers)

    def forget(self, task_id: str, reader: _Reader) -> None:
        if self._readers.get(task_id) is reader:
            del self._readers[task_id]


class _Reader:
    """One task's tasks/result stream, read in the background; each question kept."""

    def __init__(
        self,
        owner: TaskInput,
        replica: Replica,
        opened: Opened,
        route: TaskRoute,
        headers: dict[str, str],
    ) -> None:
        self._owner = owner
        self._replica = replica
        self._opened = opened
        self._route = route
        self._headers = headers
        self._seen = asyncio.Event()  # a question was kept, or the reading ended
        self.ended = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def first(self, timeout_s: float) -> None:
        """Until this reader keeps a question (seen once: the next wait waits for another)
        or ends, at most `timeout_s`."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._seen.wait()
        except TimeoutError:
            return  # none yet
        if not self.ended:
            self._seen.clear()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def done(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _read(self) -> None:
        route = self._route
        request_id = f"taskgate-result-{next(_ids)}"
        body = orjson.dumps(
            {"jsonrpc": "2.0", "id": request_id, "method": "tasks/result",
             "params": {"taskId": route.task_id}}
        )  # fmt: skip
        sent = {**self._headers, **self._opened.headers, "Content-Type": _JSON, "Accept": _ACCEPT}
        life_s = max((route.expires_at_ms - now_ms()) / 1000, 1.0)
        try:
            upstream = await send(
                self._owner.pool, self._replica, request_id, body, header_lines(sent), life_s,
                False,
            )  # fmt: skip
            try:
                if content_type(upstream) == EVENT_STREAM:
                    await self._questions(upstream.chunks())
            finally:
                upstream.close()
        except (GatewayError, ExchangeError, FrameTooLarge) as failed:
            log.info("reading a 2025-era task's questions at %s: %s", self._replica.label, failed)
        finally:
            self.ended = True
            self._seen.set()
            self._owner.forget(route.task_id, self)

    async def _questions(self, chunks: Any) -> None:
        decoder = SSEDecoder(MAX_EVENT_BYTES)
        store, route = self._owner.store, self._route
        async for chunk in chunks:
            kept: dict[str, bytes] = {}
            for frame in decoder.feed(chunk):
                if frame.data is None:
                    continue
                try:
                    message = orjson.loads(frame.data)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(message, dict) and "method" in message and "id" in message:
                    kept[f"taskgate-{message['id']}"] = frame.data.encode()
            if kept:
                await store.add_questions(route.task_id, kept, route.expires_at_ms)
                self._seen.set()


def _as_request(question: bytes) -> dict[str, Any]:
    """A kept question as the extension names it in inputRequests: its method and params,
    without the 2025-11-25 related-task mark (the extension has none)."""
    message = orjson.loads(question)
    params = message.get("params")
    unmarked = without_related_task(params) if isinstance(params, dict) else {}
    return {"method": message.get("method"), "params": unmarked}


def without_related_task(value: dict[str, Any]) -> dict[str, Any]:
    """`value` (params or a result) without the 2025-11-25 related-task mark in its `_meta`,
    which the extension does not have (and `_meta` gone when nothing else was in it)."""
    meta = value.get("_meta")
    if not isinstance(meta, dict) or RELATED_TASK not in meta:
        return value
    rest = {k: v for k, v in meta.items() if k != RELATED_TASK}
    unmarked = {k: v for k, v in value.items() if k != "_meta"}
    if rest:
        unmarked["_meta"] = rest
    return unmarked
