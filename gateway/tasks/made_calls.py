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

from gateway.errors import UpstreamUnreachable
from gateway.protocol.meta import CLIENT_CAPABILITIES_KEY, TASKS_EXTENSION
from gateway.upstream.calls import UpstreamCallError, UpstreamRPCError, request_result
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Replica

log = logging.getLogger("taskgate.made")

_ids = itertools.count(1)
INTERNAL_ERROR = -32603
# Room for the JSON-RPC envelope around the result that max_result_bytes bounds.
ENVELOPE_BYTES = 1024


def call_id() -> str:
    """A JSON-RPC id for one of a task's upstream requests."""
    return f"taskgate-task-{next(_ids)}"


@dataclass(frozen=True, slots=True)
class Round:
    """What one round of the call gave: a result, an error, or questions to answer first."""

    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    inputs: dict[str, Any] | None = None  # inputRequests, key -> the server's request
    state: str | None = None  # the server's requestState, sent back with the answers
    # The result as the server sent it, whatever its resultType (an answer given inline).
    answer: dict[str, Any] | None = None
    # The replica could not be reached: it never got the call (another may take it).
    unreachable: bool = False


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
    return Round(error={"code": INTERNAL_ERROR, "message": text})


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
        "_headers", "_idempotent", "_others", "_params", "_pool", "_timeout_s",
        "max_result_bytes", "replica",
    )  # fmt: skip

    def __init__(
        self,
        pool: Pool,
        replicas: list[Replica],
        params: dict[str, Any],
        headers: bytes,
        *,
        timeout_s: float,
        max_result_bytes: int,
        idempotent: bool,
    ) -> None:
        self._pool = pool
        self.replica = replicas[0]
        # The first round goes to the next when one cannot be reached (it never got the call).
        self._others = replicas[1:]
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
        request_id = call_id()
        body = orjson.dumps(
            {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
        )
        while True:
            try:
                result, _ = await request_result(
                    self._pool, self.replica, "tools/call", request_id, body, self._headers,
                    self._timeout_s, max_bytes=self.max_result_bytes + ENVELOPE_BYTES,
                    idempotent=self._idempotent,
                )  # fmt: skip
            except UpstreamCallError as failed:
                if isinstance(failed.cause, UpstreamUnreachable) and self._others:
                    self.replica = self._others.pop(0)
                    continue
                return failed_round(failed, self.max_result_bytes)
            self._others = []  # later rounds go where the first one went
            return round_of(result)

    async def stopped(self) -> None:
        return None  # closing the request is the cancel (2026-07-28, Cancellation)


def round_of(result: dict[str, Any]) -> Round:
    """A call's result as a round: its questions when it is input_required."""
    if result.get("resultType") == "input_required":
        inputs = result.get("inputRequests")
        state = result.get("requestState")
        if isinstance(inputs, dict) and inputs:
            shown = state if isinstance(state, str) else None
            return Round(inputs=inputs, state=shown, answer=result)
    return Round(result=result, answer=result)
