"""A 2025-era call whose server may ask its client something, read round by round.

A 2026-07-28 client that declares elicitation, sampling or roots may be asked during a call;
a 2025-era server asks on the call's event stream and waits. So the stream of such a call is
read here, not relayed through: each client request (the call, then each retry that answers a
question) is one round, told the call's progress and log messages as they come, and ending
with the call's answer, or with `input_required` naming the questions not yet answered
(gateway/bridge/asking.py makes the reply). Between rounds nobody reads the stream: the
replica's socket holds what it sends (at most HIGH_WATER in taskgate, the backlog's bound, and
one event of at most MAX_EVENT_BYTES being decoded), and the call waits in the process's table
(gateway/bridge/waiting.py), its session kept in use.

A question the client did not declare, or one past the replica's limit of waiting calls, is
declined as on a relayed call (gateway/bridge/calls.py).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from typing import Any, Protocol

import orjson

from gateway.auth import Principal
from gateway.bridge.callers import SESSION_TIMEOUT_S, Caller, CallerSessions
from gateway.bridge.own_session import Opened, declined, notify
from gateway.bridge.questions import QUESTIONS
from gateway.bridge.shapes import completed
from gateway.errors import UnsafeHeader
from gateway.h1.request import DownstreamRequest, DownstreamResponse, Reply, Stream
from gateway.protocol.codes import RequestId
from gateway.protocol.sse import SSEDecoder, encode_event
from gateway.upstream.connection import UpstreamResponse
from gateway.upstream.framing import ConnectFailed, ExchangeError
from gateway.upstream.relay import (
    EVENT_STREAM,
    JSON,
    MAX_EVENT_BYTES,
    SSE_HEADERS,
    content_type,
    header_lines,
)
from gateway.upstream.replicas import Backend, Replica

LOG_LEVEL_KEY = "io.modelcontextprotocol/logLevel"
# A call's stream resumed at most this many times in a row without an event between, each
# after the server's `retry` (DEFAULT_RETRY_MS when it gave none; at most MAX_RETRY_MS).
MAX_RESUMES = 3
DEFAULT_RETRY_MS = 100
MAX_RETRY_MS = 5000


def questions_of(capabilities: dict[str, Any]) -> frozenset[str]:
    """The questions a caller that declared `capabilities` may be asked."""
    return frozenset(asked for name, asked in QUESTIONS.items() if name in capabilities)


def told(method: str, logs: bool) -> bool:
    """Whether a notification on a call's stream is the call's, for a 2026-07-28 client: its
    progress, and its log messages when the request asked with a logLevel; the rest is the
    session's."""
    return method == "notifications/progress" or (logs and method == "notifications/message")


class Told(Protocol):
    """Who is told a call's progress and log messages as they come: a client's Round, or
    nobody (a task taskgate runs, gateway/tasks/made_session.py)."""

    async def notify(self, message: dict[str, Any], method: str, token: Any) -> None: ...


class Call:
    """One call of a caller that may be asked: where it goes and in whose name."""

    __slots__ = (
        "backend",
        "caller",
        "headers",
        "kept",
        "may_ask",
        "name",
        "opened",
        "principal",
        "replica",
    )

    def __init__(
        self,
        backend: Backend,
        replica: Replica,
        caller: Caller,
        opened: Opened,
        principal: Principal,
        name: str,
        may_ask: frozenset[str],
        headers: dict[str, str],
    ) -> None:
        self.backend = backend
        self.replica = replica
        self.caller = caller
        self.opened = opened
        self.principal = principal
        self.name = name
        self.may_ask = may_ask
        self.headers = headers
        # Whether a held call took the session over (it releases it when it ends).
        self.kept = False


class Held:
    """One call's event stream, across its rounds, with the session it runs in (kept in use
    until end()) and the questions asked and not yet answered, under taskgate's keys. Its
    requestState binds it to its caller: each round is the first one's `call`."""

    __slots__ = (
        "_chunks",
        "_decoder",
        "_ended",
        "_frames",
        "_keys",
        "_last_id",
        "_resumed",
        "_retry_ms",
        "asked",
        "call",
        "method",
        "sessions",
        "token",
        "upstream",
        "upstream_id",
    )

    def __init__(
        self,
        sessions: CallerSessions,
        call: Call,
        upstream: UpstreamResponse,
        request_id: RequestId,
        method: str,
        token: Any,
    ) -> None:
        self.sessions = sessions
        self.call = call
        self.upstream = upstream
        self.upstream_id = request_id
        self.method = method
        self.token = token  # the progressToken the server reports progress under
        self.asked: dict[str, dict[str, Any]] = {}
        self._keys = itertools.count(1)
        self._chunks = upstream.chunks()
        self._decoder = SSEDecoder(MAX_EVENT_BYTES)
        self._frames: deque[str] = deque()
        self._ended = False
        self._last_id: str | None = None  # of the stream's last event that had one
        self._retry_ms = DEFAULT_RETRY_MS  # the server's `retry`: the wait before resuming
        self._resumed = 0

    @property
    def replica_url(self) -> str:
        return self.call.replica.url

    def end(self, reason: str | None) -> None:
        """The call is over: its connection closed, its session let go; `reason`: it ended
        unanswered, which the server is told (a 2025 server takes no disconnect for a cancel)."""
        if self._ended:
            return
        self._ended = True
        self.upstream.close()  # harmless on one read to its end (it acts on its own exchange)
        call = self.call
        if reason is not None:
            self.sessions.cancel_later(call.replica, call.opened, self.upstream_id, reason)
        self.sessions.release(call.replica, call.caller, call.opened)

    async def answer(self, question: dict[str, Any], response: dict[str, Any]) -> int | None:
        """POST the client's answer to one of the server's questions on the session: the HTTP
        status (2xx: taken), None when the replica could not be reached."""
        call = self.call
        body = orjson.dumps({"jsonrpc": "2.0", "id": question.get("id"), "result": response})
        return await notify(
            self.sessions.pool, call.replica, call.opened, call.headers, body, SESSION_TIMEOUT_S
        )

    async def read(self, told: Told, may_wait: bool) -> dict[str, Any] | None:
        """Read until the call's answer (returned, in the 2026 shape) or a question the client
        can be asked (None: `asked` holds it); `may_wait`: a question may keep the call waiting.
        What the client is told meanwhile goes to `told`. ExchangeError when the stream ends
        without an answer."""
        while True:
            message = await self._next()
            if message is None:
                raise ExchangeError("the event stream ended without an answer")
            method = message.get("method")
            if method is None:
                if message.get("id") == self.upstream_id:
                    return completed(message, self.method)
                continue  # an answer that is not the call's
            if "id" in message:
                if may_wait and method in self.call.may_ask:
                    self.asked[f"taskgate-{next(self._keys)}"] = message
                    return None
                self.sessions.post_later(self.call.replica, self.call.opened, declined(message))
                continue
            await told.notify(message, method, self.token)

    async def _next(self) -> dict[str, Any] | None:
        """The next message of the stream, or None at its end (a stream the server closed
        after an event id, before the answer, is resumed first: _resume)."""
        while True:
            while not self._frames:
                try:
                    chunk = await self._chunks.__anext__()
                except StopAsyncIteration:
                    if not await self._resume():
                        return None
                    continue
                for frame in self._decoder.feed(chunk):
                    self._resumed = 0
                    if frame.id:
                        self._last_id = frame.id
                    if frame.retry is not None:
                        self._retry_ms = min(frame.retry, MAX_RETRY_MS)
                    if frame.data is not None:
                        self._frames.append(frame.data)
            data = self._frames.popleft()
            try:
                message = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(message, dict):
                return message

    async def _resume(self) -> bool:
        """The server closed the call's stream before its answer, after an event with an id
        (2025-11-25 polling: a server that keeps its events answers later, to a GET with
        Last-Event-ID): the stream resumed there, at most MAX_RESUMES times in a row without
        an event; False when it cannot be."""
        if self._last_id is None or self._resumed >= MAX_RESUMES:
            return False
        self._resumed += 1
        # The wait the server asked for (the SSE `retry`): resuming sooner may find the
        # stream it closed not closed yet (the TypeScript SDK then loses what follows).
        await asyncio.sleep(self._retry_ms / 1000)
        call = self.call
        headers = {
            **call.headers,
            **call.opened.headers,
            "Accept": "text/event-stream",
            "Last-Event-ID": self._last_id,
        }
        deadline = asyncio.get_running_loop().time() + call.backend.timeout_s
        try:
            resumed = await self.sessions.pool.bodiless(
                b"GET", call.replica.url, header_lines(headers), deadline=deadline
            )
        except (ConnectFailed, ExchangeError, UnsafeHeader):
            return False
        if resumed.status != 200 or content_type(resumed) != EVENT_STREAM:
            resumed.close()
            return False
        self.upstream = resumed  # the one that ended was read to its end: nothing to close
        self._chunks = resumed.chunks()
        self._decoder = SSEDecoder(MAX_EVENT_BYTES)
        return True


class Round:
    """What one client request is told: the call's progress (under the request's own
    progressToken) and, when it asked with a logLevel, its log messages, as they come on an
    event stream opened at the first of them; then the round's last message."""

    __slots__ = ("_downstream", "_logs", "_token", "answer_id", "stream")

    def __init__(
        self, downstream: DownstreamRequest, answer_id: RequestId, meta: dict[str, Any]
    ) -> None:
        self._downstream = downstream
        self.answer_id = answer_id
        self._token = meta.get("progressToken")
        self._logs = LOG_LEVEL_KEY in meta
        self.stream: Stream | None = None

    async def notify(self, message: dict[str, Any], method: str, token: Any) -> None:
        if method == "notifications/progress":
            params = message.get("params")
            if self._token is None or not isinstance(params, dict):
                return
            if params.get("progressToken") != token:
                return  # not the call's progress
            if self._token != token:
                message = {**message, "params": {**params, "progressToken": self._token}}
        elif not told(method, self._logs):
            return  # the session's, not the call's
        await self._send(orjson.dumps(message))

    async def last(self, body: bytes) -> Reply:
        """The round's last message: the whole reply when nothing was told before it."""
        if self.stream is None:
            return DownstreamResponse(200, body, JSON)
        await self.stream.write(encode_event(body.decode(), event="message"))
        await self.stream.end()
        return self.stream

    async def _send(self, body: bytes) -> None:
        if self.stream is None:
            self.stream = self._downstream.stream(200, dict(SSE_HEADERS))
        await self.stream.write(encode_event(body.decode(), event="message"))
