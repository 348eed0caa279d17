"""subscriptions/listen through taskgate, against the two real report replicas (FastMCP 4.1.4,
which serves no listen itself: every event here is taskgate's emulation): the refusal before
any stream, one acknowledgement first, task snapshots equal to tasks/get's across both
replicas, ids left out alike, list_changed per tenant, limits, the client's close and the
graceful end (issue 13)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from gateway.config import LimitsConfig
from tests.gateway.conftest import REPORT_TOOLS
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.listen import (
    SERVER_INFO_META,
    ListenStream,
    listening,
    next_event,
    subscription_id,
)
from tests.support.mcp import TASKS_EXTENSION, mcp_call, poll_until, result_of
from tests.support.procs import BackendProcess, stop_all
from tests.support.tasks import APPROVE

ids = itertools.count(110_000)
WITHIN = 20.0  # seconds any one expected event may take


def listen_config(issuer: Issuer, backends: list[BackendProcess], **subscriptions: Any) -> Any:
    return gateway_config(
        {"reports": [b.url for b in backends]},
        [(REPORT_TOOLS, "reports"), {"prompts": ["report_*"], "backend": "reports"}],
        auth=jwt_auth(issuer),
        subscriptions={
            "min_poll_interval_ms": 50,
            "default_poll_interval_ms": 100,
            **subscriptions,
        },
    )


@pytest.fixture
async def gateway(
    issuer: Issuer, report_backends: list[BackendProcess]
) -> AsyncIterator[RunningGateway]:
    async with serving(listen_config(issuer, report_backends)) as running:
        yield running


async def create_task(
    http: aiohttp.ClientSession, url: str, token: str, *, delay_ms: int = 0
) -> dict[str, Any]:
    """A report task; it stays "working" `delay_ms`, then parks in input_required."""
    params = {"name": "generate_report", "arguments": {"size": "small", "delay_ms": delay_ms}}
    answer = await mcp_call(http, url, "tools/call", params, token=token)
    assert answer.status == 200, answer.raw
    created = result_of(answer.message)
    assert created["resultType"] == "task"
    return created


async def task_get(
    http: aiohttp.ClientSession, url: str, token: str, task_id: str
) -> dict[str, Any]:
    answer = await mcp_call(http, url, "tasks/get", {"taskId": task_id}, token=token)
    assert answer.status == 200, answer.raw
    return result_of(answer.message)


def as_snapshot(result: dict[str, Any]) -> dict[str, Any]:
    """A tasks/get result as notifications/tasks carries it: less resultType and _meta."""
    return {k: v for k, v in result.items() if k not in ("resultType", "_meta")}


def moved(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A snapshot less lastUpdatedAt, which FastMCP stamps with the time of each read."""
    return {k: v for k, v in snapshot.items() if k != "lastUpdatedAt"}


# --- the request ---------------------------------------------------------------------------


async def test_task_ids_without_the_extension_are_refused_before_any_stream(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway
) -> None:
    async with listening(
        http, gateway.url, {"taskIds": []}, id=5, token=issuer.token(), tasks=False
    ) as stream:
        assert stream.status == 400
        assert stream.response.content_type == "application/json"
        answer = await stream.body()
    assert answer["id"] == 5
    assert answer["error"]["code"] == -32021
    assert answer["error"]["data"] == {
        "requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}
    }


@pytest.mark.parametrize(
    "notifications", [{"toolsListChanged": "yes"}, {"taskIds": "t"}, {"resourceSubscriptions": [1]}]
)
async def test_a_malformed_filter_is_invalid_params(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    notifications: dict[str, Any],
) -> None:
    async with listening(http, gateway.url, notifications, id=6, token=issuer.token()) as stream:
        answer = await stream.body()
    assert (stream.status, answer["error"]["code"]) == (200, -32602)


@pytest.mark.parametrize("listen_id", [7, "seven"])
async def test_one_acknowledgement_first_tagged_with_the_listen_id_as_sent(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway, listen_id: int | str
) -> None:
    notifications = {"toolsListChanged": True, "resourceSubscriptions": ["reports://about"]}
    async with listening(
        http, gateway.url, notifications, id=listen_id, token=issuer.token()
    ) as stream:
        assert stream.status == 200
        assert stream.response.content_type == "text/event-stream"
        ack = await next_event(stream)
    assert ack == {
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {
            # what taskgate honours; resourceSubscriptions omitted: FastMCP cannot push them
            "notifications": {"toolsListChanged": True},
            "_meta": {"io.modelcontextprotocol/subscriptionId": listen_id},
        },
    }
    assert type(subscription_id(ack)) is type(listen_id)


# --- tasks ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quick_replicas() -> Iterator[list[BackendProcess]]:
    """Two report replicas whose tasks advertise pollIntervalMs 200 (FastMCP's is 5000)."""
    replicas = [
        BackendProcess(name, extra_args=("--poll-interval-ms", "200")) for name in ("q1", "q2")
    ]
    try:
        yield [replica.start() for replica in replicas]
    finally:
        stop_all(replicas)


async def test_one_listen_follows_tasks_on_both_replicas_leaving_out_foreign_and_bogus_ids(
    http: aiohttp.ClientSession, issuer: Issuer, quick_replicas: list[BackendProcess]
) -> None:
    async with serving(listen_config(issuer, quick_replicas)) as gateway:
        await follow_two_tasks(http, issuer, gateway)


async def follow_two_tasks(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway
) -> None:
    ann, bob = issuer.token("acme", "ann"), issuer.token("acme", "bob")
    tasks = [await create_task(http, gateway.url, ann, delay_ms=1500) for _ in range(2)]
    owners = {(await gateway.state.tasks.store.lookup(t["taskId"])).replica for t in tasks}  # type: ignore[union-attr]
    assert len(owners) == 2, "the replicas take turns: one task on each"
    foreign = await create_task(http, gateway.url, bob)
    wanted = [t["taskId"] for t in tasks]
    asked = [wanted[0], foreign["taskId"], "no-such-task", wanted[1]]

    async with listening(http, gateway.url, {"taskIds": asked}, id="watch", token=ann) as stream:
        ack = await next_event(stream)
        assert ack["params"]["notifications"] == {"taskIds": wanted}
        seen: dict[str, list[dict[str, Any]]] = {task_id: [] for task_id in wanted}
        finished: set[str] = set()
        approved: set[str] = set()
        while finished != set(wanted):
            event = await next_event(stream)
            assert event["method"] == "notifications/tasks", event
            assert subscription_id(event) == "watch"
            params = dict(event["params"])
            del params["_meta"]
            task_id = params["taskId"]
            assert task_id in seen, "a task left out of the acknowledgement is never sent"
            seen[task_id].append(params)
            if params["status"] == "input_required" and task_id not in approved:
                # Parked until answered: the stream's snapshot is what tasks/get says now, or
                # (FastMCP touches lastUpdatedAt twice on the way in) the next one is.
                now = as_snapshot(await task_get(http, gateway.url, ann, task_id))
                assert moved(params) == moved(now)
                approved.add(task_id)
                (key,) = params["inputRequests"]
                update = {"taskId": task_id, "inputResponses": {key: APPROVE}}
                answer = await mcp_call(http, gateway.url, "tasks/update", update, token=ann)
                assert answer.status == 200
            if params["status"] in ("completed", "failed", "cancelled"):
                now = as_snapshot(await task_get(http, gateway.url, ann, task_id))
                assert moved(params) == moved(now)
                finished.add(task_id)
    for snapshots in seen.values():
        statuses = [s["status"] for s in snapshots]
        # The approved call runs again, "working" for a moment: a poll may land in it (CI did).
        assert statuses in (
            ["working", "input_required", "completed"],
            ["working", "input_required", "working", "completed"],
        ), statuses
        # one event per move of the task, never the same state twice in a row (a state may
        # come back: "working" again after the approval)
        assert all(moved(a) != moved(b) for a, b in itertools.pairwise(snapshots)), statuses


async def test_a_closed_stream_stops_its_pollers_and_frees_its_place(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    config = listen_config(issuer, report_backends, max_streams_per_principal=1)
    async with serving(config) as gateway:
        ann = issuer.token("acme", "ann")
        task = await create_task(http, gateway.url, ann)
        hub = gateway.state.listens
        async with listening(
            http, gateway.url, {"taskIds": [task["taskId"]]}, id=1, token=ann
        ) as stream:
            await next_event(stream)
            assert (hub.streams, hub.pollers) == (1, 1)
            async with listening(
                http, gateway.url, {"toolsListChanged": True}, id=2, token=ann
            ) as second:
                assert_retryable_listen(second.status, await second.body(), 2)
        async with asyncio.timeout(WITHIN):
            await hub.idle.wait()  # no stream and no poller left
        async with listening(
            http, gateway.url, {"toolsListChanged": True}, id=3, token=ann
        ) as stream:
            assert stream.status == 200


# Seconds an admission or a refusal may take: a listen admitted past a limit fails an assertion
# here, rather than hanging until the test's timeout.
PROMPTLY = 5.0


async def test_past_max_streams_per_principal_a_listen_is_refused_until_one_closes(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    config = listen_config(issuer, report_backends)
    config = config.model_copy(
        update={"limits": LimitsConfig.model_validate({"principal": {"listen_streams": 2}})}
    )
    flags = {"toolsListChanged": True}
    ann, bob = issuer.token("acme", "ann"), issuer.token("acme", "bob")
    async with serving(config) as gateway, contextlib.AsyncExitStack() as held:
        hub = gateway.state.listens

        async def admitted(token: str, listen_id: str, stack: contextlib.AsyncExitStack) -> None:
            async with asyncio.timeout(PROMPTLY):
                opened = listening(http, gateway.url, flags, id=listen_id, token=token)
                stream: ListenStream = await stack.enter_async_context(opened)
                assert stream.status == 200, await stream.body()
                ack = await stream.next()
            assert ack["method"] == "notifications/subscriptions/acknowledged"
            assert subscription_id(ack) == listen_id

        first = await held.enter_async_context(contextlib.AsyncExitStack())
        await admitted(ann, "ann-1", first)
        await admitted(ann, "ann-2", held)
        async with (
            asyncio.timeout(PROMPTLY),
            listening(http, gateway.url, flags, id="ann-3", token=ann) as refused,
        ):
            # Checked before the body is read: an admitted stream's body would not end.
            assert refused.status == 429
            assert refused.response.content_type == "application/json"
            assert refused.response.headers["Retry-After"] == "1"
            answer = await refused.body()
        assert answer == {
            "jsonrpc": "2.0",
            "id": "ann-3",
            "error": {
                "code": -32603,
                "message": "This principal's limit of 2 open listen streams is reached "
                "(limits.principal.listen_streams); close one; retry in 1 s",
                "data": {
                    "retryable": True,
                    "limit": "principal.listen_streams",
                    "retryAfterMs": 1000,
                },
            },
        }
        await admitted(bob, "bob-1", held)  # another principal of the tenant: a count of his own

        async def streams() -> int:
            return hub.streams

        await first.aclose()  # ann closes one: her place is given back once taskgate sees it
        await poll_until(streams, lambda count: count == 2, within=PROMPTLY)
        await admitted(ann, "ann-4", held)
        assert hub.streams == 3


def assert_retryable_listen(status: int, answer: dict[str, Any], listen_id: int) -> None:
    assert status == 429
    assert answer["id"] == listen_id
    assert answer["error"]["code"] == -32603
    assert answer["error"]["data"]["limit"] == "principal.listen_streams"
    assert "(limits.principal.listen_streams)" in answer["error"]["message"]


async def test_drain_ends_each_stream_with_the_listen_result_then_closes(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway
) -> None:
    async with listening(
        http, gateway.url, {"toolsListChanged": True}, id="d1", token=issuer.token()
    ) as stream:
        await next_event(stream)
        gateway.state.listens.drain()
        async with asyncio.timeout(WITHIN):
            rest = await stream.until_end()
    assert rest == [
        {
            "jsonrpc": "2.0",
            "id": "d1",
            "result": {
                "resultType": "complete",
                "_meta": {"io.modelcontextprotocol/subscriptionId": "d1", **SERVER_INFO_META},
            },
        }
    ]


async def test_an_idle_stream_gets_keepalive_comments(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    config = listen_config(issuer, report_backends, keepalive_s=0.05)
    async with (
        serving(config) as gateway,
        listening(
            http, gateway.url, {"toolsListChanged": True}, id=9, token=issuer.token()
        ) as stream,
    ):
        await next_event(stream)
        async with asyncio.timeout(WITHIN):
            await stream.comment()
            await stream.comment()


async def test_past_max_streams_a_listen_is_refused_at_once_naming_the_limit(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    async with serving(listen_config(issuer, report_backends, max_streams=1)) as gateway:
        flags = {"toolsListChanged": True}
        async with listening(
            http, gateway.url, flags, id=1, token=issuer.token("acme", "a")
        ) as one:
            await next_event(one)
            token = issuer.token("globex", "g")  # another principal: the process-wide limit
            async with listening(http, gateway.url, flags, id=2, token=token) as refused:
                answer = await refused.body()
        assert refused.status == 503
        assert refused.response.headers["Retry-After"] == "1"
        assert answer["error"]["data"] == {"retryable": True}
        assert "subscriptions.max_streams" in answer["error"]["message"]


async def test_listens_opened_at_once_never_pass_the_stream_limit_together(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    """The place is taken before the first await of the admission: eight listens racing for
    two places get two streams and six refusals, whatever the interleaving."""
    async with serving(listen_config(issuer, report_backends, max_streams=2)) as gateway:
        flags = {"toolsListChanged": True, "promptsListChanged": True}
        statuses: list[int] = []
        opened = asyncio.Event()

        async def listen(n: int) -> None:
            token = issuer.token("acme", f"p{n}")
            async with listening(http, gateway.url, flags, id=n, token=token) as stream:
                statuses.append(stream.status)
                if len(statuses) == 8:
                    opened.set()
                if stream.status == 200:
                    await next_event(stream)
                    async with asyncio.timeout(WITHIN):
                        await opened.wait()  # hold the place until every answer is in

        async with asyncio.timeout(WITHIN):
            await asyncio.gather(*(listen(n) for n in range(8)))
        assert sorted(statuses) == [200, 200] + [503] * 6
