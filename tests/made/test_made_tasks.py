"""Tasks taskgate runs itself for a backend without tasks: what a client sees, in one process."""

from __future__ import annotations

import aiohttp

from gateway.protocol.tasks import MADE_PREFIX, is_made
from tests.gateway.conftest import REPORT_TOOLS
from tests.made.conftest import call, label, made_config, stats, task_method
from tests.support.gateway import gateway_config, serving
from tests.support.mcp import build_request, poll_until, post_raw, result_of, wait_for_task_status
from tests.support.procs import BackendProcess, PlainBackendProcess, RedisProcess
from tests.support.tasks import assert_retryable, create_report

TERMINAL = frozenset({"completed", "failed", "cancelled"})


async def test_always_answers_a_call_with_a_task_that_completes_with_the_tools_result(
    http: aiohttp.ClientSession, plain_backend: PlainBackendProcess
) -> None:
    _, direct = await call(http, plain_backend.url, "quick", text="hello")
    async with serving(made_config([plain_backend.url])) as gateway:
        status, response = await call(http, gateway.url, "quick", text="hello")
        assert status == 200
        created = result_of(response)
        assert created["resultType"] == "task"
        assert created["taskId"].startswith(MADE_PREFIX)
        assert created["status"] == "working"
        assert created["ttlMs"] == 3_600_000
        assert created["pollIntervalMs"] == 1000
        assert {"createdAt", "lastUpdatedAt"} <= created.keys()

        done = await wait_for_task_status(http, gateway.url, created["taskId"], TERMINAL)

    assert done["status"] == "completed"
    assert done["resultType"] == "complete"
    assert done["result"] == result_of(direct)


async def test_a_client_without_the_extension_gets_the_answer_inline(
    http: aiohttp.ClientSession, plain_backend: PlainBackendProcess
) -> None:
    async with serving(made_config([plain_backend.url])) as gateway:
        status, response = await call(http, gateway.url, "quick", tasks=False, text="inline")

    assert status == 200
    answer = result_of(response)
    assert answer.get("resultType", "complete") == "complete"
    assert answer["content"][0]["text"] == "p1:inline"


async def test_offer_answers_inline_in_time_and_with_a_task_after(
    http: aiohttp.ClientSession, plain_backend: PlainBackendProcess
) -> None:
    job = label()
    config = made_config([plain_backend.url], mode="offer", after_ms=300)
    async with serving(config) as gateway:
        _, quick = await call(http, gateway.url, "quick", text="fast")
        assert result_of(quick)["content"][0]["text"] == "p1:fast"

        _, slow = await call(http, gateway.url, "work", label=job)
        created = result_of(slow)
        assert created["resultType"] == "task"
        task_id = created["taskId"]
        working = result_of(await task_method(http, gateway.url, "tasks/get", task_id))
        assert working["status"] == "working"

        await call(http, plain_backend.url, "release", label=job)
        done = await wait_for_task_status(http, gateway.url, task_id, TERMINAL)

    assert done["status"] == "completed"
    assert done["result"]["structuredContent"] == {"label": job, "replica": "p1"}
    assert await stats(http, plain_backend.url, job) == {
        "started": 1, "cancelled": 0, "completed": 1,
    }  # fmt: skip


async def test_a_tool_error_completes_the_task_with_is_error(
    http: aiohttp.ClientSession, plain_backend: PlainBackendProcess
) -> None:
    async with serving(made_config([plain_backend.url])) as gateway:
        _, response = await call(http, gateway.url, "broken", why="no paper")
        task_id = result_of(response)["taskId"]
        done = await wait_for_task_status(http, gateway.url, task_id, TERMINAL)

    assert done["status"] == "completed"
    assert done["result"]["isError"] is True
    assert "no paper" in done["result"]["content"][0]["text"]


async def test_an_answer_over_max_result_bytes_fails_the_task_saying_so(
    http: aiohttp.ClientSession, plain_backend: PlainBackendProcess
) -> None:
    async with serving(made_config([plain_backend.url], max_result_bytes=4096)) as gateway:
        _, small = await call(http, gateway.url, "big", size=1000)
        _, large = await call(http, gateway.url, "big", size=50_000)
        kept = await wait_for_task_status(http, gateway.url, result_of(small)["taskId"], TERMINAL)
        refused = await wait_for_task_status(
            http, gateway.url, result_of(large)["taskId"], TERMINAL
        )

    assert kept["status"] == "completed"
    assert refused["status"] == "failed"
    assert refused["error"]["code"] == -32603
    assert "max_result_bytes (4096 bytes)" in refused["error"]["message"]
    assert refused["statusMessage"] == refused["error"]["message"]


async def test_questions_become_input_required_and_tasks_update_answers_them(
    http: aiohttp.ClientSession, plain_backend: PlainBackendProcess
) -> None:
    async with serving(made_config([plain_backend.url])) as gateway:
        _, response = await call(http, gateway.url, "approve", item="budget")
        task_id = result_of(response)["taskId"]
        asking = await wait_for_task_status(http, gateway.url, task_id, {"input_required"})
        (key,) = asking["inputRequests"]
        assert key == "1.approval"  # the task's own key, never reused in its life
        assert asking["inputRequests"][key]["method"] == "elicitation/create"

        # Unknown keys are ignored; the right one lets the call go on.
        answer = {"action": "accept", "content": {"approved": True}}
        unknown = {"2.approval": answer}
        await task_method(http, gateway.url, "tasks/update", task_id, inputResponses=unknown)
        still = result_of(await task_method(http, gateway.url, "tasks/get", task_id))
        assert still["status"] == "input_required"

        await task_method(http, gateway.url, "tasks/update", task_id, inputResponses={key: answer})
        done = await wait_for_task_status(http, gateway.url, task_id, TERMINAL)

    assert done["status"] == "completed"
    assert done["result"]["structuredContent"] == {
        "item": "budget", "approved": True, "replica": "p1",
    }  # fmt: skip


async def test_cancel_stops_the_backends_work_and_the_task_ends_cancelled(
    http: aiohttp.ClientSession, plain_backend: PlainBackendProcess
) -> None:
    job = label()
    async with serving(made_config([plain_backend.url])) as gateway:
        _, response = await call(http, gateway.url, "work", label=job)
        task_id = result_of(response)["taskId"]
        await poll_until(
            lambda: stats(http, plain_backend.url, job), lambda seen: seen["started"] == 1
        )
        acknowledged = await task_method(http, gateway.url, "tasks/cancel", task_id)
        assert result_of(acknowledged) == {"resultType": "complete"}
        done = await wait_for_task_status(http, gateway.url, task_id, TERMINAL)
        counted = await poll_until(
            lambda: stats(http, plain_backend.url, job), lambda seen: seen["cancelled"] == 1
        )

    assert done["status"] == "cancelled"
    assert counted == {"started": 1, "cancelled": 1, "completed": 0}


async def test_a_store_that_cannot_write_fails_the_call_closed_and_the_call_never_runs(
    http: aiohttp.ClientSession, plain_backend: PlainBackendProcess
) -> None:
    job = label()
    with RedisProcess() as redis:
        async with serving(made_config([plain_backend.url], store=redis.url)) as gateway:
            redis.kill()
            body = build_request("tools/call", {"name": "work", "arguments": {"label": job}}, id=9)
            answer = await post_raw(http, gateway.url, body)
            refused = gateway.state.made.outcomes["store_down"]

    assert_retryable(answer, 9)
    assert "could not be recorded" in answer.message["error"]["message"]
    assert refused == 1
    assert (await stats(http, plain_backend.url, job))["started"] == 0


async def test_a_backend_that_runs_tasks_itself_keeps_its_own(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess]
) -> None:
    route = {"tools": REPORT_TOOLS, "backend": "reports", "task": {"mode": "always"}}
    config = gateway_config({"reports": [report_backends[0].url]}, [route])
    async with serving(config) as gateway:
        created = await create_report(http, gateway.url, "own")
        _, echoed = await call(http, gateway.url, "echo", text="inline")
        route_kept = await gateway.state.tasks.store.lookup(created["taskId"])

    assert not is_made(created["taskId"])
    assert route_kept is not None  # routed to the replica that made it, as ever
    assert result_of(echoed)["content"][0]["text"] == "inline"


async def test_a_partial_update_keeps_the_task_asking_what_is_still_open(
    http: aiohttp.ClientSession, plain_backend: PlainBackendProcess
) -> None:
    yes, no = {"action": "accept", "content": {"approved": True}}, {"action": "decline"}
    async with serving(made_config([plain_backend.url])) as gateway:
        _, response = await call(http, gateway.url, "approve_both", first="a", second="b")
        task_id = result_of(response)["taskId"]
        asking = await wait_for_task_status(http, gateway.url, task_id, {"input_required"})
        assert sorted(asking["inputRequests"]) == ["1.first", "1.second"]

        await task_method(
            http, gateway.url, "tasks/update", task_id, inputResponses={"1.first": yes}
        )
        # Once the holder took it, only the open question is shown (the answered one is not
        # asked again); a second answer to it is ignored.
        still = await poll_until(
            lambda: task_method(http, gateway.url, "tasks/get", task_id),
            lambda answer: list(result_of(answer).get("inputRequests", {})) == ["1.second"],
        )
        assert result_of(still)["status"] == "input_required"
        again = {"1.first": no, "1.second": no}
        await task_method(http, gateway.url, "tasks/update", task_id, inputResponses=again)
        done = await wait_for_task_status(http, gateway.url, task_id, TERMINAL)

    assert done["status"] == "completed"
    assert done["result"]["structuredContent"]["answers"] == {"first": True, "second": False}
