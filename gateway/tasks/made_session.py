"""The call of a task taskgate runs, to a replica of the 2025 era: in the caller's session
there, opened with the capabilities the client declared, so that its server may ask what the
client can answer (elicitation, sampling, roots). A question on the call's event stream ends a
round with `input_required`; the next round POSTs the answers on the session and reads on, the
stream held meanwhile (gateway/bridge/rounds.py's Held, as a client's bridged call holds it).
A stateless server has no back channel: a question it asks fails the task, saying so."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from gateway.auth import Principal
from gateway.bridge.callers import CallerSessions, caller_of
from gateway.bridge.eras import Eras
from gateway.bridge.questions import QUESTIONS
from gateway.bridge.rounds import Call, Held, questions_of
from gateway.bridge.shapes import completed
from gateway.errors import GatewayError, UpstreamUnreachable
from gateway.protocol.sse import FrameTooLarge
from gateway.tasks.made_calls import ENVELOPE_BYTES, INTERNAL_ERROR, Round, call_id, round_of
from gateway.upstream.framing import ExchangeError
from gateway.upstream.relay import EVENT_STREAM, content_type, header_lines, send
from gateway.upstream.replicas import Backend, Replica

_CANCELLED = "the task was cancelled"
_JSON = "application/json"
_ACCEPT = "application/json, text/event-stream"


class _Nobody:
    """A task's call tells nobody its progress: the client polls the task."""

    async def notify(self, message: dict[str, Any], method: str, token: Any) -> None:
        return None


_NOBODY = _Nobody()


def _error(message: str, unreachable: bool = False) -> Round:
    return Round(error={"code": INTERNAL_ERROR, "message": message}, unreachable=unreachable)


class SessionCall:
    """The call in the caller's session on a 2025-era replica, across its rounds."""

    __slots__ = (
        "_backend",
        "_caller",
        "_capabilities",
        "_eras",
        "_extra",
        "_held",
        "_may_ask",
        "_others",
        "_params",
        "_pool",
        "_principal",
        "_request_id",
        "_sessions",
        "_stateless",
        "_timeout_s",
        "_tool",
        "max_result_bytes",
        "replica",
    )  # fmt: skip

    def __init__(
        self,
        sessions: CallerSessions,
        eras: Eras,
        backend: Backend,
        replicas: list[Replica],
        params: dict[str, Any],
        principal: Principal,
        extra: dict[str, str],
        declared: dict[str, Any],
        *,
        timeout_s: float,
        max_result_bytes: int,
    ) -> None:
        self._sessions = sessions
        self._pool = sessions.pool
        self._eras = eras
        self._backend = backend
        # The call goes to the next when one cannot be reached (it never got the call).
        self._others = replicas[1:]
        self.replica = replica = replicas[0]
        self._stateless = eras.stateless(replica)
        self._params = {k: v for k, v in params.items() if k != "_meta"}
        tool = params.get("name")
        self._tool = tool if isinstance(tool, str) else ""
        self._principal = principal
        self._extra = extra
        self._caller, self._capabilities = caller_of(principal.tenant, principal.subject, declared)
        # A stateless server cannot be answered (no session ties the answer to the call): any
        # question it asks stops the call (_read), as the bridge's calls do.
        stateless = self._stateless is not None
        self._may_ask = (
            frozenset(QUESTIONS.values()) if stateless else questions_of(self._capabilities)
        )
        self._timeout_s = timeout_s
        self.max_result_bytes = max_result_bytes
        self._request_id = call_id()
        self._held: Held | None = None

    async def round(self, responses: dict[str, Any] | None, state: str | None) -> Round:
        held = self._held
        if held is None:
            told = await self._first()
            while told.unreachable and self._others:
                self._to(self._others.pop(0))
                told = await self._first()
            self._others = []
            return told
        refused = await self._answer(held, responses or {})
        return refused if refused is not None else await self._read(held)

    async def _first(self) -> Round:
        opened = self._stateless
        if opened is None:  # the caller's session, as the bridge's calls use it
            try:
                opened = await self._sessions.acquire(
                    self.replica, self._caller, self._capabilities, None
                )
            except GatewayError as refused:
                return _error(refused.message, isinstance(refused, UpstreamUnreachable))
        body = orjson.dumps(
            {"jsonrpc": "2.0", "id": self._request_id, "method": "tools/call",
             "params": self._params}
        )  # fmt: skip
        sent = {**self._extra, **opened.headers, "Content-Type": _JSON, "Accept": _ACCEPT}
        keep = False
        try:
            upstream = await send(
                self._pool, self.replica, self._request_id, body, header_lines(sent),
                self._timeout_s, False,
            )  # fmt: skip
            if content_type(upstream) == EVENT_STREAM:
                call = Call(
                    self._backend, self.replica, self._caller, opened, self._principal,
                    self._tool, self._may_ask, self._extra,
                )  # fmt: skip
                # The held stream owns the session from here: it lets it go when it ends.
                self._held = Held(
                    self._sessions, call, upstream, self._request_id, "tools/call", None
                )
                keep = True
                return await self._read(self._held)
            try:
                raw = await upstream.read(self.max_result_bytes + ENVELOPE_BYTES)
            finally:
                upstream.close()
            return self._answered(raw, upstream.status)
        except asyncio.CancelledError:
            # Cancelled before its answer: a 2025 server takes no disconnect for a cancel.
            self._sessions.cancel_later(self.replica, opened, self._request_id, _CANCELLED)
            raise
        except GatewayError as failed:
            return _error(failed.message, isinstance(failed, UpstreamUnreachable))
        except ExchangeError as broken:
            return _error(f"{self.replica.label}: {broken}")
        finally:
            if not keep and opened is not self._stateless:
                self._sessions.release(self.replica, self._caller, opened)

    def _to(self, replica: Replica) -> None:
        """The call goes to `replica` instead, in the caller's session there."""
        self.replica = replica
        self._stateless = self._eras.stateless(replica)
        if self._stateless is not None:
            self._may_ask = frozenset(QUESTIONS.values())

    def _answered(self, raw: bytes, status: int) -> Round:
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return _error(f"{self.replica.label} answered HTTP {status} without a JSON-RPC answer")
        return self._ending(message if isinstance(message, dict) else {})

    def _ending(self, message: dict[str, Any]) -> Round:
        shaped = completed(message, "tools/call")
        result, error = shaped.get("result"), shaped.get("error")
        if isinstance(result, dict):
            return round_of(result)
        if isinstance(error, dict):
            return Round(error=error)
        return _error(f"{self.replica.label} answered the call with neither result nor error")

    async def _read(self, held: Held) -> Round:
        """The held stream read to the call's answer, or to questions for the client."""
        try:
            answer = await held.read(_NOBODY, bool(self._may_ask))
        except asyncio.CancelledError:
            self._end(held, _CANCELLED)
            raise
        except (ExchangeError, FrameTooLarge) as broken:
            self._end(held, "the task's call failed")
            return _error(f"{self.replica.label}: {broken}")
        if answer is None and self._stateless is not None:
            (asked,) = held.asked.values()
            self._end(held, "the server's question cannot be answered")
            return _error(
                f"{self.replica.label} asked {asked.get('method')} during the call, and a "
                "server without sessions cannot be answered"
            )
        if answer is None:
            inputs = {
                key: {"method": asked["method"], "params": asked.get("params") or {}}
                for key, asked in held.asked.items()
            }
            return Round(inputs=inputs)
        self._end(held, None)
        return self._ending(answer)

    async def _answer(self, held: Held, responses: dict[str, Any]) -> Round | None:
        """Each answer POSTed on the session as the answer to the server's question; None when
        all were taken, else the task's error."""
        call = held.call
        for key, response in responses.items():
            asked = held.asked.pop(key, None)
            if asked is None:
                continue
            status = await held.answer(asked, response)
            if status is None or not 200 <= status < 300:
                self._end(held, "the task's call could not be answered")
                return _error(
                    f"{call.replica.label} did not take the answer to its {asked.get('method')} "
                    f"(HTTP {status or 'unreachable'})"
                )
        return None

    def _end(self, held: Held, reason: str | None) -> None:
        held.end(reason)
        self._held = None

    async def stopped(self) -> None:
        """The call was cancelled; the server was told as its round ended (_first, _read): a
        call still held (cancelled between rounds, waiting for answers) is ended here."""
        held = self._held
        if held is not None:
            self._end(held, _CANCELLED)
