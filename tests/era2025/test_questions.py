"""A 2025-era server's questions during a call, put to a 2026-07-28 client that declared the
capability as the core's MRTR puts them: `input_required` with `inputRequests` and a
requestState, answered by the client's retry, which gets the call's answer or the next
question. Against the stateful servers of both SDKs (a stateless one has no session to take an
answer in), with the SDK 2.x client as a client too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import mcp
import pytest
from mcp.client.session import ClientRequestContext
from mcp.types import ElicitRequestParams, ElicitResult

from gateway.bridge.waiting import UNKNOWN
from gateway.ops.exposition import snapshot
from gateway.ops.status_page import gather
from tests.support.era2025 import ROUTES, Era2025Process, call, exchange, text
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.mcp import poll_until

ASKS: dict[str, Any] = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
YES = {"action": "accept", "content": {"ok": True}}
NO = {"action": "accept", "content": {"ok": False}}


@pytest.fixture
async def asked(stateful: Era2025Process) -> AsyncIterator[RunningGateway]:
    async with serving(gateway_config({"old": [stateful.url]}, ROUTES)) as running:
        yield running


def confirm(question: str, **more: Any) -> dict[str, Any]:
    return {"name": "confirm", "arguments": {"question": question}, "_meta": ASKS, **more}


def in_use(gateway: RunningGateway) -> list[int]:
    """How many calls use each caller's session now."""
    return [held.in_use for t in gateway.state.callers._tables.values() for held in t.held.values()]


async def test_a_question_reaches_the_client_and_its_answer_the_server(
    asked: RunningGateway,
) -> None:
    first = await call(asked.url, "tools/call", confirm("Proceed?"))
    assert first["resultType"] == "input_required"
    ((key, question),) = first["inputRequests"].items()
    assert question["method"] == "elicitation/create"
    assert question["params"]["message"] == "Proceed?"
    assert asked.state.callers.waiting.count() == 1
    assert in_use(asked) == [1]  # the call holds its session while it waits
    numbers = snapshot(asked.state)  # what /metrics says
    assert numbers["taskgate_bridge_waiting_calls"] == [[1]]
    (replica,) = asked.state.backends["old"].replicas
    assert numbers["taskgate_bridge_sessions"] == [["old", replica.label, 1]]
    # and the status page, in its backends table
    (backend,) = (await gather(asked.state)).backends
    assert [r.sessions for r in backend.replicas] == [1]
    state = first["requestState"]
    retry = confirm("Proceed?", inputResponses={key: YES}, requestState=state)
    answered = await call(asked.url, "tools/call", retry)
    assert (answered["resultType"], text(answered)) == ("complete", "yes")
    assert asked.state.callers.waiting.count() == 0
    assert in_use(asked) == [0]


async def test_each_question_in_turn_and_progress_under_the_retrys_token(
    asked: RunningGateway,
) -> None:
    params: dict[str, Any] = {"name": "survey", "_meta": {**ASKS, "progressToken": "first"}}
    first = await call(asked.url, "tools/call", params)
    ((key, question),) = first["inputRequests"].items()
    assert question["params"]["message"] == "first?"
    retry = {
        "name": "survey",
        "_meta": {**ASKS, "progressToken": "second"},
        "inputResponses": {key: YES},
        "requestState": first["requestState"],
    }
    messages = await exchange(asked.url, "tools/call", retry)
    progress, last = messages[:-1], messages[-1]["result"]
    # The progress the server reported after the first answer reaches the retry, as its own.
    assert [(p["params"]["progressToken"], p["params"]["progress"]) for p in progress] == [
        ("second", 1)
    ]
    ((second_key, question),) = last["inputRequests"].items()
    assert question["params"]["message"] == "second?"
    assert second_key != key  # keys are unique over the call's life
    # A retry with no progressToken is told no progress.
    done = {
        "name": "survey",
        "_meta": ASKS,
        "inputResponses": {second_key: NO},
        "requestState": last["requestState"],
    }
    messages = await exchange(asked.url, "tools/call", done)
    assert len(messages) == 1
    assert text(messages[0]["result"]) == "yes,no"


async def test_the_sdk_client_answers_through_its_elicitation_callback(
    asked: RunningGateway,
) -> None:
    seen: list[str] = []

    async def elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        seen.append(params.message)
        return ElicitResult(action="accept", content={"ok": params.message == "first?"})

    async with mcp.Client(asked.url, elicitation_callback=elicit) as sdk:
        result = await sdk.call_tool("survey", {})
    assert [block.text for block in result.content if block.type == "text"] == ["yes,no"]
    assert seen == ["first?", "second?"]


async def test_a_request_state_is_good_for_its_caller_its_request_and_once(
    stateful: Era2025Process, issuer: Issuer
) -> None:
    config = gateway_config({"old": [stateful.url]}, ROUTES, auth=jwt_auth(issuer))
    alice, bob = issuer.token("acme", "alice"), issuer.token("acme", "bob")
    async with serving(config) as gateway:
        first = await call(gateway.url, "tools/call", confirm("Ship?"), token=alice)
        ((key, _),) = first["inputRequests"].items()
        state = first["requestState"]
        head, _, mac = state.rpartition(".")
        refused = [
            # another caller
            (confirm("Ship?", inputResponses={key: YES}, requestState=state), bob),
            # another tool
            (
                {
                    "name": "add",
                    "arguments": {"a": 1, "b": 2},
                    "_meta": ASKS,
                    "inputResponses": {key: YES},
                    "requestState": state,
                },
                alice,
            ),
            # altered: a later expiry, and a forged MAC
            (confirm("Ship?", inputResponses={key: YES}, requestState=f"{head}9.{mac}"), alice),
            (confirm("Ship?", inputResponses={key: YES}, requestState=f"{head}.{'A' * 22}"), alice),
        ]
        for params, token in refused:
            (answer,) = await exchange(gateway.url, "tools/call", params, token=token)
            assert answer["error"] == {"code": -32602, "message": UNKNOWN}, params
        # None of them took the call: its own caller still can, once.
        retry = confirm("Ship?", inputResponses={key: YES}, requestState=state)
        assert text(await call(gateway.url, "tools/call", retry, token=alice)) == "yes"
        (again,) = await exchange(gateway.url, "tools/call", retry, token=alice)
        assert again["error"]["message"] == UNKNOWN


async def test_answers_that_are_not_results_are_refused_and_the_call_still_waits(
    asked: RunningGateway,
) -> None:
    first = await call(asked.url, "tools/call", confirm("Go?"))
    ((key, _),) = first["inputRequests"].items()
    bad = confirm("Go?", inputResponses={key: "yes"}, requestState=first["requestState"])
    (answer,) = await exchange(asked.url, "tools/call", bad)
    assert answer["error"]["code"] == -32602
    assert "inputResponses" in answer["error"]["message"]
    good = confirm("Go?", inputResponses={key: NO}, requestState=first["requestState"])
    assert text(await call(asked.url, "tools/call", good)) == "no"


async def test_a_call_whose_client_never_answers_is_cancelled_upstream(
    stateful: Era2025Process,
) -> None:
    options = {"old": {"sessions": {"input_wait_s": 0.2}}}
    config = gateway_config({"old": [stateful.url]}, ROUTES, backend_options=options)
    async with serving(config) as gateway:
        params = {"name": "survey", "_meta": ASKS}
        first = await call(gateway.url, "tools/call", params)
        assert first["resultType"] == "input_required"

        # No retry comes: past input_wait_s the call ends, and the server is told.
        async def noted() -> list[str]:
            return stateful.noted()

        await poll_until(noted, lambda marks: "cancelled survey" in marks)
        assert gateway.state.callers.waiting.count() == 0
        assert in_use(gateway) == [0]
        ((key, _),) = first["inputRequests"].items()
        late = {**params, "inputResponses": {key: YES}, "requestState": first["requestState"]}
        (answer,) = await exchange(gateway.url, "tools/call", late)
        assert answer["error"]["message"] == UNKNOWN


async def test_a_retry_at_another_instance_is_told_where_it_must_go(
    stateful: Era2025Process,
) -> None:
    config = gateway_config({"old": [stateful.url]}, ROUTES)
    async with serving(config) as holder, serving(config) as other:
        first = await call(holder.url, "tools/call", confirm("Here?"))
        ((key, _),) = first["inputRequests"].items()
        retry = confirm("Here?", inputResponses={key: YES}, requestState=first["requestState"])
        (answer,) = await exchange(other.url, "tools/call", retry)
        assert answer["error"]["code"] == -32602
        assert "another taskgate instance holds" in answer["error"]["message"]
        # The holder still answers it.
        assert text(await call(holder.url, "tools/call", retry)) == "yes"
