"""One tenant cannot take every slot: past its share of taskgate's in-flight requests, or of a
backend's calls, its next request gets the retryable 503 naming limits.tenant_share, while
another tenant's calls are served; one principal's 2025-era GET streams stop at
legacy.max_streams_per_principal, while another principal still opens one (docs/decisions.md,
35)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.listen.stream import ACKNOWLEDGED
from tests.gateway.conftest import EchoUpstream
from tests.support.echo_upstream import RELEASE, SEEN
from tests.support.gateway import gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.legacy import LegacyClient
from tests.support.listen import ListenStream, listening, next_event
from tests.support.mcp import Answer, mcp_call, poll_until


def held_calls(upstream: EchoUpstream) -> int:
    """The `hang` calls that reached the upstream, where they wait for RELEASE."""
    bodies = [orjson.loads(seen["body"]) for seen in upstream.app[SEEN]]
    return sum(b["method"] == "tools/call" and b["params"]["name"] == "hang" for b in bodies)


@pytest.mark.parametrize(
    ("listen", "backend", "refusal"),
    [
        ({"max_in_flight": 10}, {}, "of taskgate's 10 requests in flight"),
        ({}, {"max_in_flight": 10}, "of the 10 calls in flight to backend 'echo'"),
    ],
    ids=["listen.max_in_flight", "backends.X.max_in_flight"],
)
async def test_a_tenant_past_its_share_is_refused_while_another_is_served(
    http: aiohttp.ClientSession,
    echo_upstream: EchoUpstream,
    issuer: Issuer,
    listen: dict[str, Any],
    backend: dict[str, Any],
    refusal: str,
) -> None:
    config = gateway_config(
        {"echo": [echo_upstream.url]},
        [(["*"], "echo")],
        listen=listen,
        backend_options={"echo": backend},
        auth=jwt_auth(issuer),
    )
    globex, acme = issuer.token("globex", "gina"), issuer.token("acme", "alice")
    async with serving(config) as gateway:
        before = held_calls(echo_upstream)
        slow = [
            asyncio.create_task(
                mcp_call(http, gateway.url, "tools/call", {"name": "hang"}, token=globex)
            )
            for _ in range(15)
        ]
        try:

            async def refused() -> list[Answer]:
                return [task.result() for task in slow if task.done()]

            # Exactly its share, 5 of 10, reaches the upstream and waits there; the 10 others
            # are refused at once.
            answers = await poll_until(refused, lambda done: len(done) == 10, within=10)

            async def held() -> int:
                return held_calls(echo_upstream) - before

            assert await poll_until(held, lambda count: count >= 5, within=10) == 5
            for answer in answers:
                assert answer.status == 503
                assert answer.headers["Retry-After"] == "1"
                error = answer.message["error"]
                assert error["code"] == -32603
                assert error["data"] == {"retryable": True}
                assert f"Tenant 'globex' holds its share of 5 {refusal}" in error["message"]
                assert "(limits.tenant_share)" in error["message"]
            # Meanwhile every call of another tenant is served.
            for _ in range(20):
                served = await mcp_call(
                    http, gateway.url, "tools/call", {"name": "headers"}, token=acme
                )
                assert served.status == 200, served.raw
                assert "result" in served.message
            assert sum(not task.done() for task in slow) == 5  # still held upstream
            echo_upstream.app[RELEASE].set()
            finished = await asyncio.gather(*slow)
            assert sorted(answer.status for answer in finished) == [200] * 5 + [503] * 10
        finally:
            echo_upstream.app[RELEASE].set()
            await asyncio.gather(*slow, return_exceptions=True)
        coordinator = gateway.state.coordinator
        assert (coordinator.in_flight, coordinator.per_tenant()) == (0, {})
        assert coordinator.per_backend() == {}


async def test_a_tenants_listen_streams_hold_none_of_its_share(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, issuer: Issuer
) -> None:
    """A listen is admitted inside a slot and streams outside it: three open streams leave the
    tenant its whole share (2 of 4) for calls."""
    config = gateway_config(
        {"echo": [echo_upstream.url]},
        [(["*"], "echo")],
        listen={"max_in_flight": 4},
        auth=jwt_auth(issuer),
    )
    globex = issuer.token("globex", "gina")
    async with (
        serving(config) as gateway,
        contextlib.AsyncExitStack() as streams,
    ):
        for n in range(3):
            stream: ListenStream = await streams.enter_async_context(
                listening(http, gateway.url, {"toolsListChanged": True}, id=n, token=globex)
            )
            async with asyncio.timeout(10):
                assert (await next_event(stream))["method"] == ACKNOWLEDGED
        before = held_calls(echo_upstream)
        slow = [
            asyncio.create_task(
                mcp_call(http, gateway.url, "tools/call", {"name": "hang"}, token=globex)
            )
            for _ in range(2)
        ]
        try:

            async def held() -> int:
                return held_calls(echo_upstream) - before

            await poll_until(held, lambda count: count == 2, within=10)
            refused = await mcp_call(
                http, gateway.url, "tools/call", {"name": "hang"}, token=globex
            )
            assert refused.status == 503
            assert "share of 2 of taskgate's 4" in refused.message["error"]["message"]
        finally:
            echo_upstream.app[RELEASE].set()
            await asyncio.gather(*slow, return_exceptions=True)
        assert [answer.status for answer in await asyncio.gather(*slow)] == [200, 200]


async def test_a_principals_get_streams_stop_at_its_limit_while_another_opens_one(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, issuer: Issuer
) -> None:
    config = gateway_config(
        {"echo": [echo_upstream.url]},
        [(["*"], "echo")],
        auth=jwt_auth(issuer),
        limits={"principal": {"session_streams": 2}},
    )
    async with serving(config) as gateway:

        async def client(tenant: str, subject: str) -> LegacyClient:
            made = LegacyClient(http, gateway.url, token=issuer.token(tenant, subject))
            assert (await made.initialize()).status == 200
            return made

        def get(made: LegacyClient) -> Any:
            return http.get(gateway.url, headers={**made.headers(), "Accept": "text/event-stream"})

        gina = [await client("globex", "gina") for _ in range(3)]
        async with get(gina[0]) as first, get(gina[1]) as second:
            assert (first.status, second.status) == (200, 200)
            async with get(gina[2]) as third:
                assert third.status == 429
                assert third.headers["Retry-After"] == "1"
                error = orjson.loads(await third.read())["error"]
                assert error["data"] == {
                    "retryable": True,
                    "limit": "principal.session_streams",
                    "retryAfterMs": 1000,
                }
                assert "(limits.principal.session_streams)" in error["message"]
            # Another principal, even of the same tenant, still opens one.
            for tenant, subject in (("acme", "alice"), ("globex", "greg")):
                async with get(await client(tenant, subject)) as other:
                    assert other.status == 200
        streams = gateway.state.legacy
        assert streams is not None

        async def open_streams() -> int:
            return streams.streams.open

        # Closed, its streams are given back: the principal opens one again.
        await poll_until(open_streams, lambda count: count == 0, within=10)
        async with get(gina[2]) as again:
            assert again.status == 200
