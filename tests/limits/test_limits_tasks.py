"""Task quotas of the `limits` section against real report replicas (FastMCP with tasks) and the
plain backend whose calls taskgate runs as tasks: a tenant, or a principal, holding its
live_tasks gets 429 naming the limit on its next call that may create a task, while other
tenants and principals, and its calls that cannot create one, are served; tasks_per_minute
takes a token per task created, not per call; on Redis every instance counts in one set; a
2025-era client's task-augmented call meets the same count."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gateway.config import Config, LimitsConfig
from gateway.protocol.tasks import MADE_PREFIX
from gateway.store.base import now_ms
from tests.gateway.conftest import REPORT_TOOLS
from tests.made.conftest import made_config
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.legacy import LegacyClient
from tests.support.mcp import Answer, build_request, mcp_call, poll_until, post_raw, result_of
from tests.support.procs import BackendProcess, PlainBackendProcess, RedisProcess

REPORT = {"name": "generate_report", "arguments": {"size": "small"}}
ECHO = {"name": "echo", "arguments": {"text": "still served"}}
SQLITE = "sqlite:///:memory:"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest) -> str:
    """Each store in turn: SQLite counts in process, Redis in the (flushed) session server."""
    if request.param == "sqlite":
        return SQLITE
    url: str = request.getfixturevalue("redis_url")
    return url


def report_config(
    issuer: Issuer,
    backends: list[BackendProcess],
    limits: dict[str, Any],
    *,
    store: str = SQLITE,
    **sections: Any,
) -> Config:
    return gateway_config(
        {"reports": [b.url for b in backends]},
        [(REPORT_TOOLS, "reports")],
        store=store,
        auth=jwt_auth(issuer),
        limits=limits,
        **sections,
    )


async def create(http: aiohttp.ClientSession, url: str, token: str) -> dict[str, Any]:
    """A generate_report task, which must be created."""
    answer = await mcp_call(http, url, "tools/call", REPORT, token=token)
    assert answer.status == 200, answer.raw
    created = result_of(answer.message)
    assert created["resultType"] == "task", created
    return created


async def plain_echo(http: aiohttp.ClientSession, url: str, token: str) -> Answer:
    """echo by a client that does not declare the Tasks extension."""
    body = build_request("tools/call", ECHO, id=4242, tasks=False)
    return await post_raw(http, url, body, headers={"Authorization": f"Bearer {token}"})


def assert_refused(answer: Answer, limit: str) -> int:
    """The 429 naming `limit`, its Retry-After the whole seconds of retryAfterMs; that."""
    assert answer.status == 429, answer.raw
    error = answer.message["error"]
    assert error["code"] == -32603
    assert f"(limits.{limit})" in error["message"]
    data = error["data"]
    assert (data["retryable"], data["limit"]) == (True, limit)
    wait_ms = data["retryAfterMs"]
    assert type(wait_ms) is int
    assert wait_ms >= 1
    assert int(answer.headers["Retry-After"]) == max(1, math.ceil(wait_ms / 1000))
    return wait_ms


def recorded(*gateways: RunningGateway) -> int:
    return sum(g.state.tasks.outcomes["recorded"] for g in gateways)


async def test_a_tenant_holding_its_live_tasks_is_refused_while_another_tenant_creates(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    store_url: str,
) -> None:
    # Every tenant may hold 2 live tasks; acme's entry lifts the limit for acme (null).
    limits = {"tenant": {"live_tasks": 2}, "tenants": {"acme": {"tenant": {"live_tasks": None}}}}
    gina, gus = issuer.token("globex", "gina"), issuer.token("globex", "gus")
    acme = issuer.token("acme", "alice")
    async with serving(report_config(issuer, report_backends, limits, store=store_url)) as gw:
        first = await create(http, gw.url, gina)
        await create(http, gw.url, gus)
        for token in (gina, gus):  # the tenant's count, whoever of it calls
            refused = await mcp_call(http, gw.url, "tools/call", REPORT, token=token)
            wait_ms = assert_refused(refused, "tenant.live_tasks")
            # Retry-After: when the oldest of its tasks leaves the store
            route = await gw.state.tasks.store.lookup(first["taskId"])
            assert route is not None
            assert route.expires_at_ms - now_ms() - 10_000 <= wait_ms
            assert wait_ms <= route.expires_at_ms - now_ms() + 1000
        assert recorded(gw) == 2, "a refused call reaches no backend"
        # Another tenant is counted apart; globex's call that cannot make a task passes.
        for _ in range(3):
            await create(http, gw.url, acme)
        served = await plain_echo(http, gw.url, gina)
        assert served.status == 200, served.raw
        assert result_of(served.message)["content"][0]["text"] == "still served"
        assert recorded(gw) == 5


async def test_each_principal_holds_its_own_live_tasks(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    limits = {"principal": {"live_tasks": 1}}
    ann, bob = issuer.token("acme", "ann"), issuer.token("acme", "bob")
    async with serving(report_config(issuer, report_backends, limits)) as gw:
        await create(http, gw.url, ann)
        refused = await mcp_call(http, gw.url, "tools/call", REPORT, token=ann)
        assert_refused(refused, "principal.live_tasks")
        await create(http, gw.url, bob)  # one principal's count is not another's
        refused = await mcp_call(http, gw.url, "tools/call", REPORT, token=bob)
        assert_refused(refused, "principal.live_tasks")
        assert recorded(gw) == 2


async def test_tasks_per_minute_takes_a_token_per_task_created_not_per_call(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    store_url: str,
) -> None:
    limits = {"tenant": {"tasks_per_minute": 2}}
    ann = issuer.token("acme", "ann")
    async with serving(report_config(issuer, report_backends, limits, store=store_url)) as gw:
        # Calls declaring the extension that make no task (echo answers inline) take nothing.
        for _ in range(3):
            inline = await mcp_call(http, gw.url, "tools/call", ECHO, token=ann)
            assert inline.status == 200, inline.raw
        await create(http, gw.url, ann)
        await create(http, gw.url, ann)
        refused = await mcp_call(http, gw.url, "tools/call", REPORT, token=ann)
        wait_ms = assert_refused(refused, "tenant.tasks_per_minute")
        assert 20_000 <= wait_ms <= 30_000, "the bucket refills one token per 30 s"
        assert recorded(gw) == 2
        assert (await plain_echo(http, gw.url, ann)).status == 200


async def test_instances_sharing_redis_count_one_tenants_live_tasks_together(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    redis_url: str,
) -> None:
    config = report_config(issuer, report_backends, {"tenant": {"live_tasks": 2}}, store=redis_url)
    ann = issuer.token("acme", "ann")
    async with serving(config) as first, serving(config) as second:
        await create(http, first.url, ann)
        await create(http, second.url, ann)
        for gw in (first, second):
            refused = await mcp_call(http, gw.url, "tools/call", REPORT, token=ann)
            assert_refused(refused, "tenant.live_tasks")
        assert (recorded(first), recorded(second)) == (1, 1)
        other = issuer.token("globex", "gina")
        await create(http, second.url, other)


async def test_a_large_quota_is_asked_once_per_lease_and_one_instance_never_passes_it(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    redis_url: str,
    redis_server: RedisProcess,
) -> None:
    # 40 live tasks: a lease of 5% lets 2 more calls through per answer with room (policy.py).
    config = report_config(issuer, report_backends, {"tenant": {"live_tasks": 40}}, store=redis_url)
    ann = issuer.token("acme", "ann")
    async with serving(config) as gw:
        asked = redis_server.scripts_run()
        for _ in range(9):  # they may create a task (the extension declared): each is counted
            answer = await mcp_call(http, gw.url, "tools/call", ECHO, token=ann)
            assert answer.status == 200, answer.raw
        assert redis_server.scripts_run() - asked < 9  # about one in three, leases lasting
        for _ in range(40):
            await create(http, gw.url, ann)
        # However the leases fell, the 41st is refused: a lease never exceeds the room left.
        assert_refused(await mcp_call(http, gw.url, "tools/call", REPORT, token=ann),
                       "tenant.live_tasks")  # fmt: skip
        # Nothing frees a place before the first task expires: until then, refused in process.
        asked = redis_server.scripts_run()
        for _ in range(5):
            answer = await mcp_call(http, gw.url, "tools/call", ECHO, token=ann)
            assert_refused(answer, "tenant.live_tasks")
        assert redis_server.scripts_run() == asked
        assert recorded(gw) == 40


async def work_stats(http: aiohttp.ClientSession, url: str, job: str) -> dict[str, int]:
    """The plain replica's own count of `work` calls of `job`, asked directly."""
    answer = await mcp_call(http, url, "tools/call", {"name": "stats", "arguments": {"label": job}})
    counted: dict[str, int] = result_of(answer.message)["structuredContent"]
    return counted


async def test_tasks_taskgate_runs_itself_count_until_they_expire(
    http: aiohttp.ClientSession, issuer: Issuer, plain_backend: PlainBackendProcess
) -> None:
    config = made_config([plain_backend.url], auth=jwt_auth(issuer))
    config = config.model_copy(
        update={"limits": LimitsConfig.model_validate({"tenant": {"live_tasks": 1}})}
    )
    ann, job = issuer.token("acme", "ann"), "limits-made-1"
    work = {"name": "work", "arguments": {"label": job}}
    async with serving(config) as gw:
        answer = await mcp_call(http, gw.url, "tools/call", work, token=ann)
        assert answer.status == 200, answer.raw
        task_id = result_of(answer.message)["taskId"]
        assert task_id.startswith(MADE_PREFIX)
        await poll_until(
            lambda: work_stats(http, plain_backend.url, job), lambda s: s["started"] == 1
        )
        refused = await mcp_call(http, gw.url, "tools/call", work, token=ann)
        assert_refused(refused, "tenant.live_tasks")
        release = {"name": "release", "arguments": {"label": job}}
        await mcp_call(http, plain_backend.url, "tools/call", release)

        async def status() -> str:
            got = await mcp_call(http, gw.url, "tasks/get", {"taskId": task_id}, token=ann)
            found: str = result_of(got.message)["status"]
            return found

        assert await poll_until(status, lambda s: s != "working") == "completed"
        # Ended, it is still held in the store until its expiry: still counted.
        assert_refused(
            await mcp_call(http, gw.url, "tools/call", work, token=ann), "tenant.live_tasks"
        )
    assert await work_stats(http, plain_backend.url, job) == {
        "started": 1,
        "cancelled": 0,
        "completed": 1,
    }


async def test_a_tools_rate_counts_a_2025_clients_calls_with_the_2026_ones(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    limits = {"tools": {"echo": {"rate_per_s": 0.01, "burst": 2}}}
    config = report_config(issuer, report_backends, limits, legacy={"enabled": True})
    gina = issuer.token("globex", "gina")
    async with serving(config) as gw:
        assert (await plain_echo(http, gw.url, gina)).status == 200  # 2026-07-28: 1 of 2
        client = LegacyClient(http, gw.url, token=gina)
        assert (await client.initialize()).status == 200
        served = await client.request("tools/call", ECHO)
        assert served.status == 200, served.text
        refused = await client.request("tools/call", ECHO)
        assert refused.status == 429, refused.text
        assert refused.error["data"]["limit"] == "tools.echo.rate_per_s"
        assert_refused(await plain_echo(http, gw.url, gina), "tools.echo.rate_per_s")
        other = await client.request("tools/call", REPORT)  # another tool: served
        assert other.status == 200, other.text


async def test_a_2025_clients_task_augmented_call_meets_the_live_tasks_count(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    limits = {"tenants": {"globex": {"tenant": {"live_tasks": 1}}}}
    config = report_config(issuer, report_backends, limits, legacy={"enabled": True})
    gina = issuer.token("globex", "gina")
    async with serving(config) as gw:
        await create(http, gw.url, gina)  # through the 2026-07-28 door: globex holds 1 of 1
        client = LegacyClient(http, gw.url, token=gina)
        assert (await client.initialize()).status == 200
        tasked = await client.request("tools/call", {**ECHO, "task": {"ttl": 60_000}})
        assert tasked.status == 429, tasked.text
        assert tasked.error["code"] == -32603
        assert tasked.error["data"]["limit"] == "tenant.live_tasks"
        assert int(tasked.headers["Retry-After"]) >= 1
        plain_call = await client.request("tools/call", ECHO)  # no params.task: served
        assert plain_call.status == 200, plain_call.text
        assert plain_call.result["content"][0]["text"] == "still served"
        other = LegacyClient(http, gw.url, token=issuer.token("acme", "alice"))
        await other.initialize()
        served = await other.request("tools/call", {**ECHO, "task": {"ttl": 60_000}})
        assert served.status == 200, served.text
