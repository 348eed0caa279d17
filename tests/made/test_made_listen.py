"""subscriptions/listen for tasks taskgate runs: pushed from the store's records, by whichever
instance the client listens on, and only to the task's owner."""

from __future__ import annotations

import aiohttp

from tests.made.conftest import call, label, made_config
from tests.support.gateway import serving
from tests.support.issuer import jwt_auth, running_issuer
from tests.support.listen import ListenStream, listening, next_event, subscription_id
from tests.support.mcp import JsonObject, result_of
from tests.support.procs import PlainBackendProcess

ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
TASKS = "notifications/tasks"


async def test_a_listen_on_either_instance_is_told_each_change_of_a_task_the_other_holds(
    http: aiohttp.ClientSession, plain_backend: PlainBackendProcess, redis_url: str
) -> None:
    job = label()
    async with running_issuer("ES256") as issuer:
        config = made_config([plain_backend.url], store=redis_url, auth=jwt_auth(issuer))
        alice, bob = issuer.token("acme", "alice"), issuer.token("acme", "bob")
        async with serving(config) as a, serving(config) as b:
            _, held = await call(http, a.url, "work", token=alice, label=job)
            task_id = result_of(held)["taskId"]
            _, other = await call(http, a.url, "approve", token=alice, item="x")
            asking_id = result_of(other)["taskId"]
            wanted = {"taskIds": [asking_id, "taskgate.unknown", task_id]}
            async with (
                listening(http, b.url, wanted, id="far", token=alice) as far,
                listening(http, a.url, wanted, id="near", token=alice) as near,
                listening(http, b.url, wanted, id="stranger", token=bob) as stranger,
            ):
                for stream in (far, near):
                    ack = await next_event(stream)
                    assert ack["method"] == ACKNOWLEDGED
                    assert ack["params"]["notifications"]["taskIds"] == [asking_id, task_id]
                refused = await next_event(stranger)
                assert refused["params"]["notifications"]["taskIds"] == []

                seen: dict[str, dict[str, list[str]]] = {"far": {}, "near": {}}
                named = {"far": far, "near": near}
                for name, stream in named.items():
                    asking = await _until(stream, seen[name], asking_id, "input_required")
                    assert list(asking["inputRequests"]) == ["1.approval"]
                await call(http, plain_backend.url, "release", label=job)
                for name, stream in named.items():
                    done = await _until(stream, seen[name], task_id, "completed")
                    assert done["result"]["structuredContent"]["label"] == job
                    assert subscription_id({"params": done}) == name
                    assert "resultType" not in done
    for stream_seen in seen.values():
        assert stream_seen[task_id][-1] == "completed"
        assert "working" in stream_seen[task_id]


async def _until(
    stream: ListenStream, seen: dict[str, list[str]], task_id: str, status: str
) -> JsonObject:
    """Read task notifications (noting each status) until `task_id` reaches `status`."""
    while True:
        event = await next_event(stream)
        assert event["method"] == TASKS
        params: JsonObject = event["params"]
        seen.setdefault(params["taskId"], []).append(params["status"])
        if params["taskId"] == task_id and params["status"] == status:
            return params
