"""The upstream call of a task taskgate runs, in rounds: the tools/call as the client sent it (to
a 2026-07-28 replica; in the caller's session to one of the 2025 era), then, after each
`input_required`, again with the answers and the server's requestState. Read whole, at most the
route's max_result_bytes; cancelled by closing it (and, in a 2025-era session, by telling the
server: notifications/cancelled)."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gateway.auth import Principal
from gateway.bridge.callers import CallerSessions, caller_of
from gateway.bridge.eras import Eras
from gateway.bridge.own_session import ask, notify
from gateway.bridge.shapes import completed
from gateway.errors import GatewayError
from gateway.protocol.meta import CLIENT_CAPABILITIES_KEY, TASKS_EXTENSION
from gateway.upstream.calls import UpstreamCallError, UpstreamRPCError, request_result
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Replica

log = logging.getLogger("taskgate.made")

_ids = itertools.count(1)
_INTERNAL_ERROR = -32603
# Room for the JSON-RPC envelope around the result that max_result_bytes bounds.
_ENVELOPE_BYTES = 1024


@dataclass(frozen=True, slots=True)
class Round:
    """What one round of the call gave: a result, an error, or questions to answer first."""

    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    inputs: dict[str, Any] | None = None  # inputRequests, key -> the server's request
    state: str | None = None  # the server's requestState, sent back with the answers
    # The result as the server sent it, whatever its resultType (an answer given inline).
    answer: dict[str, Any] | None = None


class MadeCall(Protocol):
    """One tools/call run for a task; `round` may be asked again after input_required."""

    replica: Replica
    max_result_bytes: int

    async def round(self, responses: dict[str, Any] | None, state: str | None) -> Round: ...

    async def stopped(self) -> None:
        """Tell the server the call was cancelled, where closing it does not (best effort)."""
        ...


def failed_round(error: UpstreamCallError, max_result_bytes: int) -> Round:
    """The error a failed call leaves in its task: the server's own, or taskgate's words."""
    if isinstance(error, UpstreamRPCError) and error.said:
        return Round(error=error.said)
    text = str(error)
    if "larger than" in text or ("over" in text and "bytes" in text):
        text = (
            f"the tool's answer is larger than the route's task.max_result_bytes "
            f"({max_result_bytes} bytes), so it was not kept ({text})"
        )
    return Round(error={"code": _INTERNAL_ERROR, "message": text})


def _without_tasks(params: dict[str, Any]) -> dict[str, Any]:
    """The call's params with the Tasks extension taken out of the client's capabilities: the
    backend answers the call itself, never with a task of its own."""
    meta = params.get("_meta")
    if not isinstance(meta, dict):
        return dict(params)
    declared = meta.get(CLIENT_CAPABILITIES_KEY)
    if isinstance(declared, dict) and isinstance(declared.get("extensions"), dict):
        extensions = {k: v for k, v in declared["extensions"].items() if k != TASKS_EXTENSION}
        meta = {**meta, CLIENT_CAPABILITIES_KEY: {**declared, "extensions": extensions}}
    return {**params, "_meta": meta}


class ModernCall:
    """The call to a 2026-07-28 replica: stateless, so each round is a POST of its own."""

    __slots__ = (
        "_headers", "_idempotent", "_params", "_pool", "_timeout_s", "max_result_bytes", "replica",
    )  # fmt: skip

    def __init__(
        self,
        pool: Pool,
        replica: Replica,
        params: dict[str, Any],
        headers: bytes,
        *,
        timeout_s: float,
        max_result_bytes: int,
        idempotent: bool,
    ) -> None:
        self._pool = pool
        self.replica = replica
        self._params = _without_tasks(params)
        self._headers = headers
        self._timeout_s = timeout_s
        self.max_result_bytes = max_result_bytes
        self._idempotent = idempotent

    async def round(self, responses: dict[str, Any] | None, state: str | None) -> Round:
        params = dict(self._params)
        if responses is not None:
            params["inputResponses"] = responses
        if state is not None:
            params["requestState"] = state
        request_id = f"taskgate-task-{next(_ids)}"
        body = orjson.dumps(
            {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
        )
        try:
            result, _ = await request_result(
                self._pool,
                self.replica,
                "tools/call",
                request_id,
                body,
                self._headers,
                self._timeout_s,
                max_bytes=self.max_result_bytes + _ENVELOPE_BYTES,
                idempotent=self._idempotent,
            )
        except UpstreamCallError as failed:
            return failed_round(failed, self.max_result_bytes)
        return _round_of(result)

    async def stopped(self) -> None:
        return None  # closing the request is the cancel (2026-07-28, Cancellation)


class SessionCall:
    """The call in the caller's session on a 2025-era replica. Its server cannot ask the
    caller anything (taskgate declares no client capabilities there), so one round."""

    __slots__ = (
        "_extra", "_params", "_pool", "_principal", "_request_id", "_sessions", "_stateless",
        "_timeout_s", "max_result_bytes", "replica",
    )  # fmt: skip

    def __init__(
        self,
        sessions: CallerSessions,
        eras: Eras,
        pool: Pool,
        replica: Replica,
        params: dict[str, Any],
        principal: Principal,
        extra: dict[str, str],
        *,
        timeout_s: float,
        max_result_bytes: int,
    ) -> None:
        self._sessions = sessions
        self._stateless = eras.stateless(replica)
        self._pool = pool
        self.replica = replica
        self._params = {k: v for k, v in params.items() if k != "_meta"}
        self._principal = principal
        self._extra = extra
        self._timeout_s = timeout_s
        self.max_result_bytes = max_result_bytes
        self._request_id = f"taskgate-task-{next(_ids)}"

    async def round(self, responses: dict[str, Any] | None, state: str | None) -> Round:
        caller, capabilities = caller_of(self._principal.tenant, self._principal.subject, {})
        opened = self._stateless
        if opened is None:  # the caller's session, as the bridge's calls use it
            try:
                opened = await self._sessions.acquire(self.replica, caller, capabilities, None)
            except GatewayError as refused:  # the session could not be opened
                return Round(error={"code": _INTERNAL_ERROR, "message": refused.message})
        lost = False
        try:
            result = await ask(
                self._pool, self.replica, opened, self._extra, "tools/call", self._params,
                self._timeout_s, max_bytes=self.max_result_bytes + _ENVELOPE_BYTES,
                idempotent=False, request_id=self._request_id,
            )  # fmt: skip
        except UpstreamCallError as failed:
            lost = failed.status == 404
            return failed_round(failed, self.max_result_bytes)
        finally:
            if opened is not self._stateless:
                self._sessions.release(self.replica, caller, opened, lost=lost)
        # In the 2026-07-28 shape, as the bridge relays a call's result (resultType)
        return _round_of(completed({"result": result}, "tools/call")["result"])

    async def stopped(self) -> None:
        caller, capabilities = caller_of(self._principal.tenant, self._principal.subject, {})
        opened = self._stateless
        if opened is None:
            try:
                opened = await self._sessions.acquire(self.replica, caller, capabilities, None)
            except GatewayError:  # best effort: no session, nothing to tell
                return
        cancelled = orjson.dumps(
            {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": self._request_id, "reason": "the task was cancelled"},
            }
        )
        try:
            status = await notify(self._pool, self.replica, opened, self._extra, cancelled, 5.0)
            if status is None or status >= 400:
                log.info("%s did not take a task's cancel (HTTP %s)", self.replica.label, status)
        finally:
            if opened is not self._stateless:
                self._sessions.release(self.replica, caller, opened)


def _round_of(result: dict[str, Any]) -> Round:
    if result.get("resultType") == "input_required":
        inputs = result.get("inputRequests")
        state = result.get("requestState")
        if isinstance(inputs, dict) and inputs:
            shown = state if isinstance(state, str) else None
            return Round(inputs=inputs, state=shown, answer=result)
    return Round(result=result, answer=result)
