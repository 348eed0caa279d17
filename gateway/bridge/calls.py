"""A 2026-07-28 client's call to a replica of the 2025 era (tools/call, prompts/get,
resources/read, completion/complete): sent in the caller's session on that replica
(gateway/bridge/callers.py) as a 2025 request, and answered in the shapes of 2026-07-28.

Upstream, the request keeps its id and params; its `_meta` loses the 2026-07-28 keys (version,
capabilities, client info, log level: the session carries what a 2025 server reads of them),
and the headers name the session. The answer, JSON or an event stream, is relayed by the relay
(gateway/upstream/relay.forward) with each message rewritten: the result gets
`resultType: "complete"`; progress is relayed as it comes; log messages only when the request
asked for them (`logLevel`), as 2026-07-28 has it; other notifications of the session are not
the call's and are dropped. A question the server asks on the call's stream
(`elicitation/create`, `sampling/createMessage`, `roots/list`) goes to a client that declared
the capability as the core's MRTR has it (gateway/bridge/asking.py: such a client's calls are
read in rounds, not relayed); any other client cannot be asked (2026-07-28 has no requests on
a call's stream): the server is told so, and the call goes on to its end. When the client
goes away or the deadline passes before the answer, the server is told with
notifications/cancelled (in the 2025 era a disconnect is not a cancel).
A session the server no longer knows (404) is opened again and the call sent once more: the
server refused it without running it.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

import orjson

from gateway.auth import Principal
from gateway.bridge.asking import UNANSWERED, call_asking
from gateway.bridge.callers import Caller, CallerSessions, caller_of
from gateway.bridge.eras import Eras
from gateway.bridge.own_session import Opened, declined
from gateway.bridge.rounds import LOG_LEVEL_KEY, Call, questions_of, told
from gateway.bridge.shapes import completed
from gateway.bridge.tasks import (
    TaskCall,
    created,
    nested_task,
    route_of,
    run_to_end,
    serves_tasks,
    with_task,
)
from gateway.errors import BadGateway, GatewayError
from gateway.h1.request import DownstreamRequest, DownstreamResponse, Reply
from gateway.protocol.codes import RequestId
from gateway.protocol.envelope import RPCRequest
from gateway.protocol.meta import (
    CLIENT_CAPABILITIES_KEY,
    PROTOCOL_VERSION_KEY,
)
from gateway.upstream.relay import Inspector, forward, header_lines
from gateway.upstream.replicas import Backend, Replica

log = logging.getLogger("taskgate.bridge")

CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
_MODERN_META = (PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY, CLIENT_INFO_KEY, LOG_LEVEL_KEY)
_JSON = "application/json"
_ACCEPT = "application/json, text/event-stream"


async def forward_2025(
    sessions: CallerSessions,
    eras: Eras,
    backend: Backend,
    replica: Replica,
    message: RPCRequest,
    name: str | None,
    principal: Principal,
    extra: dict[str, str],
    downstream: DownstreamRequest,
    tasks: TaskCall | None = None,
) -> Reply:
    """`message` in the caller's session on `replica`, its answer relayed in 2026 shapes;
    `name`, the tool's or prompt's name or the URI, binds a question's requestState to it;
    `tasks`: a tools/call that the server may run as a task (gateway/bridge/tasks.py)."""
    meta = message.params.get("_meta")
    meta = meta if isinstance(meta, dict) else {}
    declared = meta.get(CLIENT_CAPABILITIES_KEY)
    caller, capabilities = caller_of(
        principal.tenant, principal.subject, declared if isinstance(declared, dict) else {}
    )
    client_info = meta.get(CLIENT_INFO_KEY)
    info = client_info if isinstance(client_info, dict) else None
    bridged = _Bridged(sessions, backend, replica, _as_2025(message, meta), meta, extra, downstream)
    stateless = eras.stateless(replica)
    if stateless is not None:  # no session to open: the call as it is, in the revision
        return await bridged.relay(stateless)
    may_ask = questions_of(capabilities)
    for attempt in (1, 2):
        opened = await _acquire(sessions, replica, caller, capabilities, info, message.id)
        asking = None
        lost = False
        try:
            if tasks is not None and tasks.support != "forbidden" and serves_tasks(opened):
                reply = await bridged.task(opened, caller, principal, tasks)
            elif opened.session_id:
                # Read in rounds: a question the server asks can reach a client that declared
                # it (the others are declined), and a stream the server closes before the
                # answer (2025-11-25 polling) is resumed.
                asking = Call(
                    backend, replica, caller, opened, principal, name or "", may_ask, extra
                )
                reply = await bridged.relay(opened, asking)
            else:
                reply = await bridged.relay(opened)
            lost = reply.status == 404 and bool(opened.session_id)
        finally:
            if asking is None or not asking.kept:
                sessions.release(replica, caller, opened, lost=lost)
        if not lost or attempt == 2:
            return reply
        # The server refused the call without running it: it does not know the session.
        log.info(
            "%s of %s no longer knows a caller's 2025-era session; opening another",
            replica.label,
            backend.name,
        )
    raise AssertionError("the loop returns")


class _Bridged:
    """One client request to a 2025-era replica, as it is sent there."""

    __slots__ = ("backend", "downstream", "extra", "meta", "replica", "sent", "sessions")

    def __init__(
        self,
        sessions: CallerSessions,
        backend: Backend,
        replica: Replica,
        sent: RPCRequest,
        meta: dict[str, Any],
        extra: dict[str, str],
        downstream: DownstreamRequest,
    ) -> None:
        self.sessions = sessions
        self.backend = backend
        self.replica = replica
        self.sent = sent
        self.meta = meta
        self.extra = extra
        self.downstream = downstream

    async def relay(
        self,
        opened: Opened,
        asking: Call | None = None,
        *,
        sent: RPCRequest | None = None,
        inspect: Inspector | None = None,
    ) -> Reply:
        """`sent` (the request as it is, by default) on `opened`, its answer relayed in the
        2026 shapes; `asking`: read in rounds, so that the server's questions reach the client
        (gateway/bridge/asking.py); `inspect`: sees each message first (a task's route)."""
        sessions, replica = self.sessions, self.replica
        sent = self.sent if sent is None else sent
        headers = header_lines(
            {**self.extra, **opened.headers, "Content-Type": _JSON, "Accept": _ACCEPT}
        )
        rewrite = _Rewriter(sessions, replica, opened, sent, LOG_LEVEL_KEY in self.meta)
        try:
            if asking is not None:
                return await call_asking(
                    sessions, asking, sent, headers, self.downstream, self.meta, rewrite
                )
            return await forward(
                sessions.pool,
                replica,
                sent,
                headers,
                self.backend.timeout_s,
                self.downstream,
                inspect=inspect,
                rewrite=rewrite,
            )
        except (asyncio.CancelledError, GatewayError):
            # The client left, or the call failed once sent (its deadline, a broken answer):
            # the server may still be running it, and a 2025 server takes no disconnect for a
            # cancel. (A held call has told it already.)
            held = asking is not None and asking.kept
            if not rewrite.answered and opened.session_id and not held:
                sessions.cancel_later(replica, opened, sent.id, UNANSWERED)
            raise

    async def task(
        self, opened: Opened, caller: Caller, principal: Principal, tasks: TaskCall
    ) -> Reply:
        """A tools/call the server runs as a task: relayed as the extension's task to a client
        that declared it (its route recorded first, with the session it lives in); run to its
        end for one that did not, when the tool requires a task."""
        sessions, replica, sent = self.sessions, self.replica, self.sent
        if not tasks.extension:
            if tasks.support != "required":  # the server runs it inline itself
                return await self.relay(opened)
            answer = await run_to_end(
                sessions.pool,
                replica,
                opened,
                self.extra,
                sent,
                self.backend.timeout_s,
                lambda body: sessions.post_later(replica, opened, body),
            )
            return DownstreamResponse(200, answer, _JSON)

        async def inspect(message: Any) -> None:
            task = nested_task(message, sent.id)
            if task is None:
                return
            route = route_of(
                tasks.recorder,
                task,
                replica,
                principal.tenant,
                principal.subject,
                opened,
                sent.id,
            )
            await tasks.recorder.record(route, replica, sent.id, self.extra)
            sessions.pin(replica, caller, opened, route.expires_at_ms)

        return await self.relay(opened, sent=with_task(sent), inspect=inspect)


async def _acquire(
    sessions: CallerSessions,
    replica: Replica,
    caller: Caller,
    capabilities: dict[str, Any],
    info: dict[str, Any] | None,
    request_id: RequestId,
) -> Opened:
    """The caller's session; one that cannot be opened fails the call, with its id."""
    try:
        return await sessions.acquire(replica, caller, capabilities, info)
    except GatewayError as failed:
        # A copy: the callers waiting on one opening share the exception.
        mine = copy.copy(failed)
        mine.request_id = request_id
        raise mine from None


def _as_2025(message: RPCRequest, meta: dict[str, Any]) -> RPCRequest:
    """The request as a 2025-era server reads it: the same id, method and params, its `_meta`
    without the 2026-07-28 keys (none at all when nothing else was in it)."""
    kept = {k: v for k, v in meta.items() if k not in _MODERN_META}
    params = {k: v for k, v in message.params.items() if k != "_meta"}
    if kept:
        params["_meta"] = kept
    body = orjson.dumps(
        {"jsonrpc": "2.0", "id": message.id, "method": message.method, "params": params}
    )
    return RPCRequest(message.id, message.method, params, body)


class _Rewriter:
    """Each message of a 2025-era answer as a 2026-07-28 client gets it (None: not relayed)."""

    __slots__ = (
        "_logs",
        "_method",
        "_opened",
        "_replica",
        "_request_id",
        "_sessions",
        "_task",
        "answered",
    )

    def __init__(
        self,
        sessions: CallerSessions,
        replica: Replica,
        opened: Opened,
        request: RPCRequest,
        logs: bool,
    ) -> None:
        self._sessions = sessions
        self._replica = replica
        self._opened = opened
        self._method = request.method
        self._request_id = request.id
        self._logs = logs
        self._task = "task" in request.params  # a task was asked for (bridge/tasks.py)
        self.answered = False

    def __call__(self, data: bytes) -> bytes | None:
        if not data.strip():
            # An event without data: a 2025-11-25 server that keeps its events primes each
            # stream with one (its id, to resume by), which a 2026-07-28 client has no use for.
            return None
        try:
            message = orjson.loads(data)
        except orjson.JSONDecodeError:
            return data
        if not isinstance(message, dict):
            return data
        method = message.get("method")
        if method is None:
            return self._answer(message, data)
        if "id" in message:
            self._decline(message)
            return None
        return data if told(method, self._logs) else None

    def _answer(self, message: dict[str, Any], data: bytes) -> bytes:
        """The call's answer, in the 2026 shape (a task the call made: the extension's)."""
        self.answered = True
        task = nested_task(message, self._request_id) if self._task else None
        if task is not None:
            return orjson.dumps({**message, "result": created(task)})
        shaped = completed(message, self._method)
        return data if shaped is message else orjson.dumps(shaped)

    def _decline(self, question: dict[str, Any]) -> None:
        """Answer a server's question that taskgate cannot put to the client; a stateless
        server cannot take the answer (it has no session to route it by), so the call ends."""
        asked = question.get("method")
        if not self._opened.session_id:
            raise BadGateway(
                f"Bad gateway: the backend asked {asked} during the call, which taskgate cannot "
                "put to a 2026-07-28 client, and a stateless 2025-era server cannot take an "
                "answer",
                request_id=self._request_id,
            )
        self._sessions.post_later(self._replica, self._opened, declined(question))
