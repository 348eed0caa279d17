"""Tasks taskgate runs, across two instances sharing Redis, with JWT auth: any instance answers
a task the other holds, cancels it and delivers its answers; only its owner reaches it."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from gateway.store.made import HOLDER_STOPPED
from tests.made.conftest import call, label, made_config, stats, task_method
from tests.support.gateway import serving
from tests.support.issuer import jwt_auth, running_issuer
from tests.support.mcp import poll_until, result_of
from tests.support.procs import PlainBackendProcess

TERMINAL = frozenset({"completed", "failed", "cancelled"})
NOT_FOUND = {"code": -32602, "message": "Task not found"}


async def _status_on(
    http: aiohttp.ClientSession, url: str, task_id: str, token: str, statuses: frozenset[str]
) -> Any:
    async def probe() -> Any:
        return result_of(await task_method(http, url, "tasks/get", task_id, token=token))

    return await poll_until(probe, lambda task: task["status"] in statuses)


async def test_a_task_held_by_one_instance_is_answered_cancelled_and_fed_by_the_other(
    http: aiohttp.ClientSession, plain_backend: PlainBackendProcess, redis_url: str
) -> None:
    job = label()
    async with running_issuer("ES256") as issuer:
        config = made_config([plain_backend.url], store=redis_url, auth=jwt_auth(issuer))
        alice = issuer.token("acme", "alice")
        async with serving(config) as a, serving(config) as b:
            _, held = await call(http, a.url, "work", token=alice, label=job)
            held_id = result_of(held)["taskId"]
            # No pause: the record is in the store before A handed out the id.
            seen = result_of(await task_method(http, b.url, "tasks/get", held_id, token=alice))
            assert seen["status"] == "working"
            record = await b.state.made.store.get_owned(held_id, "acme", "alice")
            assert record is not None
            assert record.holder == a.state.made.holder.instance

            # Cancelled through B: A, the holder, closes the call at its next renewal.
            await poll_until(
                lambda: stats(http, plain_backend.url, job), lambda seen: seen["started"] == 1
            )
            await task_method(http, b.url, "tasks/cancel", held_id, token=alice)
            cancelled = await _status_on(http, b.url, held_id, alice, TERMINAL)
            assert cancelled["status"] == "cancelled"
            counted = await poll_until(
                lambda: stats(http, plain_backend.url, job), lambda seen: seen["cancelled"] == 1
            )
            assert counted["completed"] == 0

            # Asked on A, answered through B.
            _, asking = await call(http, a.url, "approve", token=alice, item="trip")
            asking_id = result_of(asking)["taskId"]
            waiting = await _status_on(http, b.url, asking_id, alice, frozenset({"input_required"}))
            (key,) = waiting["inputRequests"]
            answer = {"action": "accept", "content": {"approved": False}}
            await task_method(
                http, b.url, "tasks/update", asking_id, token=alice, inputResponses={key: answer}
            )
            done = await _status_on(http, b.url, asking_id, alice, TERMINAL)

    assert done["status"] == "completed"
    assert done["result"]["structuredContent"]["approved"] is False


@pytest.mark.parametrize("sharing", ["principal", "tenant"])
async def test_only_the_owner_reaches_a_task(
    http: aiohttp.ClientSession, plain_backend: PlainBackendProcess, redis_url: str, sharing: str
) -> None:
    job = label()
    async with running_issuer("ES256") as issuer:
        auth = jwt_auth(issuer, task_sharing=sharing)
        config = made_config([plain_backend.url], store=redis_url, auth=auth)
        alice, bob = issuer.token("acme", "alice"), issuer.token("acme", "bob")
        mallory = issuer.token("globex", "alice")
        async with serving(config) as a, serving(config) as b:
            _, held = await call(http, a.url, "work", token=alice, label=job)
            task_id = result_of(held)["taskId"]
            strangers = [mallory] if sharing == "tenant" else [mallory, bob]
            for token in strangers:
                calls: tuple[tuple[str, dict[str, Any]], ...] = (
                    ("tasks/get", {}),
                    ("tasks/update", {"inputResponses": {}}),
                    ("tasks/cancel", {}),
                )
                for method, extra in calls:
                    answer = await task_method(http, b.url, method, task_id, token=token, **extra)
                    assert answer["error"] == NOT_FOUND, (method, answer)
            # Nobody else's cancel reached it: still working for its owner.
            mine = result_of(await task_method(http, b.url, "tasks/get", task_id, token=alice))
            assert mine["status"] == "working"
            if sharing == "tenant":
                shared = await task_method(http, b.url, "tasks/get", task_id, token=bob)
                assert result_of(shared)["status"] == "working"
            await call(http, plain_backend.url, "release", label=job)
            done = await _status_on(http, a.url, task_id, alice, TERMINAL)

    assert done["status"] == "completed"


async def test_a_holder_that_stops_renewing_leaves_a_failed_task_and_never_finishes_it(
    http: aiohttp.ClientSession, plain_backend: PlainBackendProcess, redis_url: str
) -> None:
    """The lease, in one process: A's renewals stop (as a paused or partitioned process's
    would), B fails the task once the lease is over, and A, renewing again, finds the task no
    longer its own and closes its call instead of finishing it."""
    job = label()
    config = made_config([plain_backend.url], store=redis_url)
    async with serving(config) as a, serving(config) as b:
        holder = a.state.made.holder
        _, held = await call(http, a.url, "work", label=job)
        task_id = result_of(held)["taskId"]
        assert holder._loop is not None
        holder._loop.cancel()  # A stops renewing
        failed = await poll_until(
            lambda: task_method(http, b.url, "tasks/get", task_id),
            lambda answer: result_of(answer)["status"] != "working",
        )
        assert result_of(failed)["status"] == "failed"
        assert result_of(failed)["error"]["message"] == HOLDER_STOPPED
        holder._loop = None
        await holder._renew(list(holder.held))  # A renews: the task is not its own
        counted = await poll_until(
            lambda: stats(http, plain_backend.url, job), lambda seen: seen["cancelled"] == 1
        )
        again = result_of(await task_method(http, a.url, "tasks/get", task_id))

    assert counted["completed"] == 0
    assert again["status"] == "failed"
    assert holder.outcomes["lost"] == 1
