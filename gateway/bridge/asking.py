"""A 2025-era server's questions during a call, put to a 2026-07-28 client as the core's MRTR
puts them: the call's answer is `resultType: "input_required"` with the questions under
`inputRequests` and a `requestState`; the client calls again with the same method, its answers
under `inputResponses` and the state echoed, and gets the call's answer, or the next questions.

Upstream nothing is retried: the first call stays open (gateway/bridge/rounds.py), each answer
is POSTed on its session as the JSON-RPC answer to the server's question, and the rest of the
same stream answers the retry. A call waits for its client at most its backend's
`sessions.input_wait_s`, then it is cancelled upstream; a retry must reach the process that
holds the call (gateway/bridge/waiting.py says why, and what another one answers).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from gateway.auth import Principal
from gateway.bridge.callers import CallerSessions
from gateway.bridge.eras import Eras
from gateway.bridge.rounds import Call, Held, Round
from gateway.bridge.waiting import WaitingCalls
from gateway.errors import BadGateway, BadRequestState, GatewayError, Retryable
from gateway.h1.request import DownstreamRequest, Reply
from gateway.protocol.codes import RequestId
from gateway.protocol.envelope import RPCRequest
from gateway.protocol.sse import FrameTooLarge, encode_event
from gateway.upstream.failures import failure
from gateway.upstream.framing import ExchangeError
from gateway.upstream.relay import EVENT_STREAM, Rewriter, content_type, relay_answer, send
from gateway.upstream.replicas import Backend

UNANSWERED = "the request ended unanswered"
ELSEWHERE = (
    "Invalid params: requestState names a call another taskgate instance holds; a retry with "
    'inputResponses must reach the instance that asked (docs/backends-2025.md, "Questions '
    'during a call"), or the call be made again without it'
)
_BAD_RESPONSES = (
    "Invalid params: inputResponses must map each key of inputRequests to the answer's result"
)


async def call_asking(
    sessions: CallerSessions,
    call: Call,
    sent: RPCRequest,
    sent_headers: bytes,
    downstream: DownstreamRequest,
    meta: dict[str, Any],
    rewrite: Rewriter,
) -> Reply:
    """`sent` on the caller's session, and its reply; once its answer is an event stream, a held
    call owns the session (`call.kept`: it releases it when it ends, not the caller). An answer
    that is not an event stream carries no question: it is relayed as any call's (`rewrite`)."""
    backend, replica = call.backend, call.replica
    upstream = await send(
        sessions.pool, replica, sent.id, sent.body, sent_headers, backend.timeout_s, False
    )
    if content_type(upstream) != EVENT_STREAM:
        return await relay_answer(
            upstream,
            sessions.pool,
            replica,
            sent,
            backend.timeout_s,
            downstream,
            None,
            False,
            rewrite,
        )
    held = Held(sessions, call, upstream, sent.id, sent.method, meta.get("progressToken"))
    call.kept = True
    return await _play(held, downstream, Round(downstream, sent.id, meta))


def resumes(
    waiting: WaitingCalls, eras: Eras, backend: Backend, state: str, request_id: RequestId
) -> bool:
    """Whether a retry's requestState (taskgate's form) is for a call this process holds; one
    of another process's is refused when the backend speaks the 2025 era (none of its replicas
    could have made it), and otherwise relayed (a taskgate behind this one made it)."""
    if waiting.issued_here(state):
        return True
    if backend.era == "2025" or any(eras.speaks_2025(backend, r) for r in backend.replicas):
        raise BadRequestState(ELSEWHERE, request_id=request_id)
    return False


async def resume(
    sessions: CallerSessions,
    message: RPCRequest,
    principal: Principal,
    name: str,
    downstream: DownstreamRequest,
) -> Reply:
    """A retry with `requestState`: its answers to the held call's server, then the rest of
    the call's stream, to its answer or the next questions."""
    params = message.params
    responses = params.get("inputResponses")
    if not isinstance(responses, dict) or not all(isinstance(v, dict) for v in responses.values()):
        raise BadRequestState(_BAD_RESPONSES, request_id=message.id)
    state = params.get("requestState")
    assert isinstance(state, str)  # the pipeline resumes only on a state of this process's
    held = sessions.waiting.claim(state, principal, message.method, name, message.id)
    if not isinstance(held, Held):  # the table holds nothing else
        raise AssertionError(held)
    meta = params.get("_meta")
    told = Round(downstream, message.id, meta if isinstance(meta, dict) else {})
    try:
        await _answer(held, responses, message)
    except BaseException:
        held.end(UNANSWERED)
        raise
    if held.asked:  # some are still to answer: the client is asked them again
        return await _ask(held, told)
    held.upstream.rearm(asyncio.get_running_loop().time() + held.call.backend.timeout_s)
    return await _play(held, downstream, told)


async def _play(held: Held, downstream: DownstreamRequest, told: Round) -> Reply:
    """One round: the stream read to the call's answer or a question for the client (each
    round is the first one's call: the requestState's MAC bound it to its caller)."""
    call = held.call
    backend = call.backend
    room = held.sessions.waiting.has_room(call.replica.url, backend.waiting_per_replica)
    try:
        answer = await held.read(told, room)
    except asyncio.CancelledError:
        held.end(UNANSWERED)
        raise
    except ConnectionResetError:  # the client left while told the call's progress
        held.end(UNANSWERED)
        downstream.cut()
        assert told.stream is not None  # only a write to the client raises it
        return told.stream
    except (ExchangeError, FrameTooLarge) as broken:
        held.end(UNANSWERED)
        return await _refused(
            told, failure(broken, call.replica, told.answer_id, backend.timeout_s, False)
        )
    if answer is None:
        return await _ask(held, told)
    held.end(None)
    answer["id"] = told.answer_id  # the retry's id: the one the client waits on
    return await told.last(orjson.dumps(answer))


async def _ask(held: Held, told: Round) -> Reply:
    """The call waits for its client, which is told what to answer, and how to present it."""
    call = held.call
    held.upstream.rearm(None)  # from now the wait is the client's (the table's timer ends it)
    state = held.sessions.waiting.park(
        held, call.principal, held.method, call.name, call.backend.input_wait_s
    )
    requests = {
        key: {"method": question["method"], "params": question.get("params") or {}}
        for key, question in held.asked.items()
    }
    result = {"resultType": "input_required", "inputRequests": requests, "requestState": state}
    body = orjson.dumps({"jsonrpc": "2.0", "id": told.answer_id, "result": result})
    return await told.last(body)


async def _answer(held: Held, responses: dict[str, Any], message: RPCRequest) -> None:
    """POST each answer on the session, as the answer to the server's question; keys not
    asked, or answered already, are left alone (as the core's MRTR has a server do)."""
    call = held.call
    for key, response in responses.items():
        question = held.asked.pop(key, None)
        if question is None:
            continue
        status = await held.answer(question, response)
        if status == 404:
            raise Retryable(
                f"{call.replica.label} no longer knows the session the call ran in; call again "
                "without requestState",
                request_id=message.id,
            )
        if status is None or not 200 <= status < 300:
            raise BadGateway(
                f"Bad gateway: {call.replica.label} did not take the answer to its "
                f"{question.get('method')} (HTTP {status or 'unreachable'})",
                request_id=message.id,
            )


async def _refused(told: Round, error: GatewayError) -> Reply:
    """An error as the round's answer: after events, as the last one."""
    if told.stream is None:
        raise error
    await told.stream.write(encode_event(error.body().decode(), event="message"))
    await told.stream.end()
    return told.stream
