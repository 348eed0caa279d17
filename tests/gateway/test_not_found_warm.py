"""Another tenant's task id is refused like an unknown one when both are warm: the task's route
sits in this process's route cache (its owner just polled it) and the unknown id was asked for
before. Same status, body and headers (Date aside), same request-log line and recorded failure
(the task hash aside), same count; and the owner's cached route is never another caller's."""

from __future__ import annotations

import secrets
from dataclasses import asdict
from typing import Any

import aiohttp
import orjson
import pytest

from tests.gateway.conftest import REPORT_TOOLS
from tests.support.attacks import bearer, headers_but_date, send
from tests.support.gateway import gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.mcp import Answer, build_request, poll_until
from tests.support.procs import BackendProcess

REQUEST_ID = 4242
# What may differ between two log lines or failures of two requests: when, how long, which id.
PER_REQUEST = {"time", "duration_ms", "at", "task"}


async def ask(
    http: aiohttp.ClientSession, url: str, token: str, method: str, task_id: str, name: bool
) -> Answer:
    body = build_request(method, {"taskId": task_id}, id=REQUEST_ID)
    return await send(http, url, body, authorization=bearer(token), name_header=name)


def shape(answer: Answer) -> tuple[int, bytes, list[tuple[str, str]]]:
    return answer.status, answer.raw, headers_but_date(answer)


def but_per_request(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key not in PER_REQUEST}


@pytest.mark.parametrize("sharing", ["principal", "tenant"])
async def test_a_cached_foreign_route_and_a_repeated_unknown_id_get_one_answer(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    capsys: pytest.CaptureFixture[str],
    sharing: str,
) -> None:
    config = gateway_config(
        {"reports": [b.url for b in report_backends]},
        [(REPORT_TOOLS, "reports")],
        auth=jwt_auth(issuer, task_sharing=sharing),
        logging={"format": "json"},
    )
    owner, other = issuer.token("acme", "alice"), issuer.token("globex", "bob")
    unknown = secrets.token_urlsafe(32)  # shaped like FastMCP's ids, never created
    async with serving(config) as gateway:
        url, tasks = gateway.url, gateway.state.tasks
        report = {"name": "generate_report", "arguments": {"size": "small"}}
        create = build_request("tools/call", report, id=1)
        created = await send(http, url, create, authorization=bearer(owner))
        task_id = created.message["result"]["taskId"]
        # The owner polls until the task waits for input: its route is now in the cache.
        await poll_until(
            lambda: ask(http, url, owner, "tasks/get", task_id, True),
            lambda answer: answer.message["result"]["status"] == "input_required",
        )
        assert tasks.cache.get("acme", "alice", task_id) is not None
        cached = len(tasks.cache)
        for id_ in (task_id, unknown):  # both seen before the answers compared
            await ask(http, url, other, "tasks/get", id_, True)
        gateway.state.observer.close()  # writes the log so far, which is left unread:
        capsys.readouterr()  # only the compared requests' lines are read below
        before = dict(tasks.outcomes)
        failures_before = len(gateway.state.observer.failures)

        compared = 0
        for method in ("tasks/get", "tasks/cancel"):
            for name in (True, False):
                foreign = await ask(http, url, other, method, task_id, name)
                again = await ask(http, url, other, method, unknown, name)
                fresh = await ask(http, url, other, method, secrets.token_urlsafe(32), name)
                label = f"{method}, Mcp-Name {'sent' if name else 'left out'}"
                assert foreign.message["error"]["code"] == -32602, label
                assert shape(foreign) == shape(again) == shape(fresh), label
                compared += 3

        # The owner's route is still cached for the owner alone; the refusals added nothing.
        assert tasks.cache.get("acme", "alice", task_id) is not None
        assert tasks.cache.get("globex", "bob", task_id) is None
        assert len(tasks.cache) == cached
        assert tasks.outcomes["not_found"] - before["not_found"] == compared
        assert tasks.outcomes["found"] == before["found"]
        failures = list(gateway.state.observer.failures)[failures_before:]
        # The owner's task still waits for it: no foreign cancel reached the backend.
        polled = await ask(http, url, owner, "tasks/get", task_id, True)
        assert polled.message["result"]["status"] == "input_required"

    lines = [
        orjson.loads(line)
        for line in capsys.readouterr().err.splitlines()
        if '"taskgate.access"' in line
    ]
    refused = lines[:compared]
    assert len(refused) == compared
    assert len({orjson.dumps(but_per_request(line)) for line in refused[0::3]}) == 2  # 2 methods
    for i in range(0, compared, 3):
        foreign_line, again_line, fresh_line = refused[i : i + 3]
        assert foreign_line["rpc_code"] == -32602
        assert (
            but_per_request(foreign_line)
            == but_per_request(again_line)
            == but_per_request(fresh_line)
        )
    assert len(failures) == compared
    for i in range(0, compared, 3):
        records = [but_per_request(asdict(failure)) for failure in failures[i : i + 3]]
        assert records[0] == records[1] == records[2]
