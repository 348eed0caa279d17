"""Limits per tenant and per principal (docs/limits.md), on real sockets: a tenant past its
rate gets 429 naming the limit while another tenant is served, on one instance and across two
sharing a Redis store; the requests in flight of a tenant and of a principal; a reload that
changes a limit; a store that does not answer (rate passes, task quotas refuse); and what the
operator sees: /metrics and the status page. Task quotas and polling: tests/limits."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gateway.config import load_config
from gateway.process.serve import Running, Source, running
from tests.gateway.conftest import EchoUpstream
from tests.gateway.test_status_page import Page
from tests.support.echo_upstream import RELEASE
from tests.support.gateway import gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.mcp import Answer, build_request, mcp_call, poll_until, post_raw
from tests.support.procs import RedisProcess

_ids = itertools.count(8_000_000)
# One token every 100 s: a bucket of `burst` requests, none given back within a test.
SLOW = 0.01


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest) -> str | None:
    """Each store in turn: None for SQLite (in process), the flushed session Redis's URL."""
    if request.param == "sqlite":
        return None
    url: str = request.getfixturevalue("redis_url")
    return url


def limited(
    upstream: EchoUpstream,
    issuer: Issuer,
    limits: dict[str, Any],
    store: str | None = None,
    **sections: Any,
) -> Any:
    """The echo upstream behind taskgate with `limits`, on SQLite or the store at `store`."""
    config = gateway_config(
        {"echo": [upstream.url]},
        [(["*"], "echo")],
        auth=jwt_auth(issuer),
        limits=limits,
        **sections,
    )
    if store is None:
        return config
    return config.model_copy(update={"store": config.store.model_copy(update={"url": store})})


async def quick(
    http: aiohttp.ClientSession, url: str, token: str, tool: str = "headers", tasks: bool = False
) -> Answer:
    """A tools/call of `tool`, which cannot create a task unless `tasks` (the client then
    declares the extension)."""
    body = build_request("tools/call", {"name": tool}, id=next(_ids), tasks=tasks)
    return await post_raw(http, url, body, headers={"Authorization": f"Bearer {token}"})


def assert_refused(answer: Answer, limit: str) -> dict[str, Any]:
    """A 429 naming `limit`, with Retry-After; the JSON-RPC error."""
    assert answer.status == 429, answer.raw
    assert int(answer.headers["Retry-After"]) >= 1
    error: dict[str, Any] = answer.message["error"]
    assert error["code"] == -32603
    assert error["data"]["retryable"] is True
    assert error["data"]["limit"] == limit
    assert f"(limits.{limit})" in error["message"]
    assert isinstance(answer.message["id"], int)  # the request's, though refused before parsing
    return error


async def test_a_tenant_past_its_rate_gets_429_while_another_tenant_is_served(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, issuer: Issuer, store_url: str | None
) -> None:
    limits = {"tenants": {"globex": {"tenant": {"rate_per_s": SLOW, "burst": 3}}}}
    config = limited(echo_upstream, issuer, limits, store_url)
    globex, acme = issuer.token("globex", "gina"), issuer.token("acme", "alice")
    async with serving(config) as gateway:
        assert [(await quick(http, gateway.url, globex)).status for _ in range(3)] == [200] * 3
        error = assert_refused(await quick(http, gateway.url, globex), "tenant.rate_per_s")
        assert error["message"].startswith(
            "This tenant's limit of 0.01 requests per second is reached"
        )
        assert error["data"]["retryAfterMs"] > 60_000  # its next token is ~100 s away
        # Another principal of the tenant shares the tenant's bucket; acme has none.
        refused = await quick(http, gateway.url, issuer.token("globex", "greg"))
        assert_refused(refused, "tenant.rate_per_s")
        assert [(await quick(http, gateway.url, acme)).status for _ in range(10)] == [200] * 10


async def test_a_tools_rate_counts_each_tenants_calls_to_it_apart(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, issuer: Issuer, store_url: str | None
) -> None:
    limits = {
        "tools": {"headers": {"rate_per_s": SLOW, "burst": 2}},
        "tenants": {"initech": {"tools": {"headers": None}}},  # lifted for initech
    }
    config = limited(echo_upstream, issuer, limits, store_url)
    gina, greg = issuer.token("globex", "gina"), issuer.token("globex", "greg")
    async with serving(config) as gateway:
        assert (await quick(http, gateway.url, gina)).status == 200
        # A call that may create a task spends the same bucket.
        assert (await quick(http, gateway.url, greg, tasks=True)).status == 200
        error = assert_refused(await quick(http, gateway.url, gina), "tools.headers.rate_per_s")
        assert error["message"].startswith(
            "This tenant's limit of 0.01 calls per second to tool 'headers' is reached "
            "(limits.tools.headers.rate_per_s); retry in "
        )
        assert_refused(await quick(http, gateway.url, greg, tasks=True), "tools.headers.rate_per_s")
        # The tenant's other tools, the tool for another tenant, and for the one lifted.
        assert (await quick(http, gateway.url, gina, tool="sse_bytes")).status == 200
        acme, initech = issuer.token("acme", "alice"), issuer.token("initech", "ian")
        assert [(await quick(http, gateway.url, acme)).status for _ in range(2)] == [200] * 2
        assert_refused(await quick(http, gateway.url, acme), "tools.headers.rate_per_s")
        assert [(await quick(http, gateway.url, initech)).status for _ in range(5)] == [200] * 5
        refusals = gateway.state.limits.refusals
        assert refusals[("tools.headers.rate_per_s", "default")] == 3


async def test_a_principal_past_its_own_rate_is_refused_and_its_colleague_is_not(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, issuer: Issuer
) -> None:
    config = limited(echo_upstream, issuer, {"principal": {"rate_per_s": SLOW, "burst": 2}})
    gina, greg = issuer.token("globex", "gina"), issuer.token("globex", "greg")
    async with serving(config) as gateway:
        assert [(await quick(http, gateway.url, gina)).status for _ in range(2)] == [200] * 2
        assert_refused(await quick(http, gateway.url, gina), "principal.rate_per_s")
        assert (await quick(http, gateway.url, greg)).status == 200


@pytest.mark.parametrize(("most_ms", "then"), [(10_000, 200), (0, 429)], ids=["paused", "off"])
async def test_a_refused_callers_connection_is_read_again_after_the_wait_it_was_told(
    echo_upstream: EchoUpstream, issuer: Issuer, store_url: str | None, most_ms: int, then: int
) -> None:
    # One token a second, a bucket of one: the second call is told to wait about a second.
    limits = {"tenant": {"rate_per_s": 1, "burst": 1}, "pause_refused_ms": most_ms}
    config = limited(echo_upstream, issuer, limits, store_url)
    token = issuer.token("globex", "gina")
    one = aiohttp.TCPConnector(limit=1)  # every call on one kept-alive connection
    async with serving(config) as gateway, aiohttp.ClientSession(connector=one) as http:
        assert (await quick(http, gateway.url, token)).status == 200
        error = assert_refused(await quick(http, gateway.url, token), "tenant.rate_per_s")
        assert error["data"]["retryAfterMs"] > 500  # the next token is most of a second away
        # Retried at once: with pause_refused_ms the retry is read once the wait is over, and
        # so served (its token has come); without, it is read at once and refused again.
        again = await quick(http, gateway.url, token)
        assert again.status == then, again.raw


async def test_a_pause_lasts_at_most_pause_refused_ms(
    echo_upstream: EchoUpstream, issuer: Issuer
) -> None:
    limits = {"tenant": {"rate_per_s": SLOW, "burst": 1}, "pause_refused_ms": 200}
    config = limited(echo_upstream, issuer, limits)
    token = issuer.token("globex", "gina")
    loop = asyncio.get_running_loop()
    one = aiohttp.TCPConnector(limit=1)
    async with serving(config) as gateway, aiohttp.ClientSession(connector=one) as http:
        assert (await quick(http, gateway.url, token)).status == 200
        assert_refused(await quick(http, gateway.url, token), "tenant.rate_per_s")
        refused_at = loop.time()
        # Told to wait ~100 s, the connection rests 200 ms: then read, and refused again.
        error = assert_refused(await quick(http, gateway.url, token), "tenant.rate_per_s")
        assert error["data"]["retryAfterMs"] > 60_000
        assert 0.1 <= loop.time() - refused_at < 60  # 0.2, less what the first 429 took to come


async def test_two_instances_on_one_redis_count_in_the_same_bucket(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, issuer: Issuer, redis_url: str
) -> None:
    limits = {"tenant": {"rate_per_s": SLOW, "burst": 4}}
    config = limited(echo_upstream, issuer, limits, redis_url)
    globex, acme = issuer.token("globex", "gina"), issuer.token("acme", "alice")
    async with serving(config) as a, serving(config) as b:
        statuses = [(await quick(http, url, globex)).status for url in (a.url, b.url) * 2]
        assert statuses == [200] * 4
        assert_refused(await quick(http, a.url, globex), "tenant.rate_per_s")
        assert_refused(await quick(http, b.url, globex), "tenant.rate_per_s")
        # Each tenant its own bucket, whichever instance it reaches.
        assert [(await quick(http, b.url, acme)).status for _ in range(4)] == [200] * 4
        assert_refused(await quick(http, a.url, acme), "tenant.rate_per_s")


async def test_a_caller_refused_is_refused_without_asking_the_store_until_its_token_is_due(
    http: aiohttp.ClientSession,
    echo_upstream: EchoUpstream,
    issuer: Issuer,
    redis_url: str,
    redis_server: RedisProcess,
) -> None:
    # globex: one token every 100 s; acme (the default): one every 200 ms. Buckets of one.
    limits = {
        "tenant": {"rate_per_s": 5, "burst": 1},
        "tenants": {"globex": {"tenant": {"rate_per_s": SLOW, "burst": 1}}},
    }
    config = limited(echo_upstream, issuer, limits, redis_url)
    globex, acme = issuer.token("globex", "gina"), issuer.token("acme", "alice")
    async with serving(config) as gateway:
        assert (await quick(http, gateway.url, globex)).status == 200
        assert_refused(await quick(http, gateway.url, globex), "tenant.rate_per_s")
        asked = redis_server.scripts_run()
        # A flood long before the next token: refused in process, the store not asked.
        for _ in range(20):
            error = assert_refused(await quick(http, gateway.url, globex), "tenant.rate_per_s")
            assert error["data"]["retryAfterMs"] > 60_000
        assert redis_server.scripts_run() == asked
        # Once the token is due, the store is asked again, and grants it.
        assert (await quick(http, gateway.url, acme)).status == 200
        error = assert_refused(await quick(http, gateway.url, acme), "tenant.rate_per_s")
        assert 0 < error["data"]["retryAfterMs"] <= 200
        assert error["message"].endswith(f"; retry in {error['data']['retryAfterMs']} ms")
        asked = redis_server.scripts_run()
        await poll_until(
            lambda: quick(http, gateway.url, acme), lambda a: a.status == 200, within=5
        )
        assert redis_server.scripts_run() > asked


@pytest.mark.parametrize(
    ("limits", "limit", "other"),
    [
        ({"tenant": {"concurrent": 2}}, "tenant.concurrent", ("acme", "alice")),
        ({"principal": {"concurrent": 2}}, "principal.concurrent", ("globex", "greg")),
    ],
    ids=["tenant", "principal"],
)
async def test_past_its_requests_in_flight_a_caller_gets_429_until_one_ends(
    http: aiohttp.ClientSession,
    echo_upstream: EchoUpstream,
    issuer: Issuer,
    limits: dict[str, Any],
    limit: str,
    other: tuple[str, str],
) -> None:
    config = limited(echo_upstream, issuer, limits)
    gina = issuer.token("globex", "gina")
    async with serving(config) as gateway:
        coordinator = gateway.state.coordinator
        held = [
            asyncio.create_task(
                mcp_call(http, gateway.url, "tools/call", {"name": "hang"}, token=gina)
            )
            for _ in range(2)
        ]

        async def in_flight() -> int:
            return coordinator.in_flight

        await poll_until(in_flight, lambda count: count == 2, within=10)
        assert_refused(await quick(http, gateway.url, gina), limit)
        assert (await quick(http, gateway.url, issuer.token(*other))).status == 200
        echo_upstream.app[RELEASE].set()
        assert [answer.status for answer in await asyncio.gather(*held)] == [200, 200]
        assert (await quick(http, gateway.url, gina)).status == 200


@contextlib.asynccontextmanager
async def from_file(path: Path, content: dict[str, Any]) -> AsyncIterator[Running]:
    """taskgate in this process, started from a file so that it can reload it."""
    source = written(path, content)
    async with running(load_config(path), source=source, drain_timeout_s=0) as process:
        yield process


def written(path: Path, content: dict[str, Any]) -> Source:
    path.write_text(yaml.safe_dump(content))
    return Source(str(path), path.read_bytes())


async def test_a_reload_changes_a_limit_and_keeps_what_the_buckets_hold(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, issuer: Issuer, tmp_path: Path
) -> None:
    content = limited(echo_upstream, issuer, {}).model_dump(mode="json", exclude_none=True)
    path = tmp_path / "taskgate.yaml"
    gina = issuer.token("globex", "gina")
    async with from_file(path, content) as process:
        assert process.reloader is not None
        assert [(await quick(http, process.url, gina)).status for _ in range(5)] == [200] * 5
        tight = {**content, "limits": {"tenant": {"rate_per_s": SLOW, "burst": 2}}}
        written(path, tight)
        entry = await process.reloader.reload("SIGHUP")
        assert entry.applied, entry.problems
        assert [(await quick(http, process.url, gina)).status for _ in range(3)] == [200, 200, 429]
        written(path, content)  # lifted again
        assert (await process.reloader.reload("SIGHUP")).applied
        assert [(await quick(http, process.url, gina)).status for _ in range(3)] == [200] * 3


async def test_without_its_store_a_rate_passes_and_a_task_quota_refuses(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, issuer: Issuer
) -> None:
    limits = {"tenant": {"rate_per_s": SLOW, "burst": 100, "live_tasks": 10}}
    gina = issuer.token("globex", "gina")
    with RedisProcess() as redis:
        config = limited(echo_upstream, issuer, limits, redis.url)
        async with serving(config) as gateway:
            assert (await quick(http, gateway.url, gina)).status == 200
            redis.stop()
            # The rate fails open: the request is served, the store's silence counted.
            assert (await quick(http, gateway.url, gina)).status == 200
            assert gateway.state.limits.store_down >= 1
            # A call that may create a task fails closed: its quota cannot be checked.
            answer = await mcp_call(
                http, gateway.url, "tools/call", {"name": "make_task"}, token=gina
            )
            assert answer.status == 503, answer.raw
            error = answer.message["error"]
            assert error["message"] == "taskgate cannot check this tenant's task quota now; retry"
            assert error["data"] == {"retryable": True}


async def test_the_operator_sees_refusals_by_limit_and_who_met_one(
    http: aiohttp.ClientSession,
    echo_upstream: EchoUpstream,
    issuer: Issuer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    limits = {
        "principal": {"rate_per_s": SLOW, "burst": 1},
        "tenants": {"globex": {"principal": {"burst": 2}}},
    }
    admin = {"host": "127.0.0.1", "port": 0}
    config = limited(echo_upstream, issuer, limits, admin=admin)
    async with serving(config) as gateway:
        assert gateway.admin_url is not None
        for tenant, subject, refused in (("globex", "gina", 2), ("initech", "ivan", 3)):
            token = issuer.token(tenant, subject)
            statuses = [(await quick(http, gateway.url, token)).status for _ in range(4)]
            assert statuses == [200] * (4 - refused) + [429] * refused
        async with http.get(f"{gateway.admin_url}/metrics") as response:
            text = await response.text()
        # By the limit, and by the tenant's name in limits.tenants or "default": no other
        # tenant's name becomes a label.
        assert (
            'taskgate_limit_refusals_total{limit="principal.rate_per_s",tenant="globex"} 2.0'
            in text
        )
        assert (
            'taskgate_limit_refusals_total{limit="principal.rate_per_s",tenant="default"} 3.0'
            in text
        )
        assert "initech" not in text
        async with http.get(f"{gateway.admin_url}/") as response:
            page = Page(await response.text())
        recent = page.table("limits", "tenant refused lately")
        assert [row[:2] for row in recent] == [
            ["initech", "principal.rate_per_s"],
            ["globex", "principal.rate_per_s"],
        ]
    # The request log names the limit of each refusal.
    lines = [line for line in capsys.readouterr().err.splitlines() if " taskgate.access " in line]
    refusals = [line for line in lines if " status=429 " in line]
    assert len(refusals) == 5
    assert all(line.endswith(" limit=principal.rate_per_s") for line in refusals)
    assert all(line.endswith(" limit=-") for line in lines if line not in refusals)
