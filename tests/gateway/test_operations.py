"""taskgate as an operator runs it: admin endpoints, limits, health, drain and bad input."""

from __future__ import annotations

import asyncio
import itertools
import operator
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from tests.gateway.conftest import REPORT_TOOLS, EchoUpstream
from tests.support.chaos import TaskgateProcess
from tests.support.echo_upstream import SEEN
from tests.support.gateway import gateway_config, running_gateway
from tests.support.mcp import build_request, mcp_headers, poll_until, post_raw
from tests.support.procs import BackendProcess, RedisProcess, free_ports

ids = itertools.count(60_000)


@asynccontextmanager
async def taskgate(tmp_path: Path, config: dict[str, Any]) -> AsyncIterator[TaskgateProcess]:
    """`taskgate run` with `config` (listen and admin ports filled in), stopped at the end."""
    port, admin = free_ports(2)
    config = {
        "listen": {"host": "127.0.0.1", "port": port, **config.pop("listen", {})},
        "admin": {"host": "127.0.0.1", "port": admin},
        "store": {"url": f"sqlite:///{tmp_path}/routes.db"},
        **config,
    }
    path = tmp_path / f"taskgate-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    process = TaskgateProcess(f"ops-{port}", path, port)
    await process.start()
    process.admin_url = f"http://127.0.0.1:{admin}"  # type: ignore[attr-defined]
    try:
        yield process
    finally:
        process.stop()


def reports(backends: list[BackendProcess], **options: Any) -> dict[str, Any]:
    return {
        "backends": {"reports": {"replicas": [b.url for b in backends], **options}},
        "routes": [{"tools": REPORT_TOOLS, "backend": "reports"}],
    }


async def readyz(http: aiohttp.ClientSession, gateway: TaskgateProcess) -> dict[str, Any]:
    async with http.get(gateway.admin_url + "/readyz") as response:  # type: ignore[attr-defined]
        body: dict[str, Any] = await response.json()
        body["status"] = response.status
        return body


async def test_healthz_and_readyz_answer_on_the_admin_listener_only(
    http: aiohttp.ClientSession, tmp_path: Path, report_backends: list[BackendProcess]
) -> None:
    async with taskgate(tmp_path, reports(report_backends)) as gateway:
        async with http.get(gateway.admin_url + "/healthz") as response:  # type: ignore[attr-defined]
            assert response.status == 200
        ready = await readyz(http, gateway)
        assert ready["status"] == 200
        assert ready["ready"] is True
        assert ready["store"] == "ok"
        assert ready["backends"] == {"reports": {"healthy": 2, "replicas": 2}}
        async with http.get(gateway.url.removesuffix("/mcp") + "/healthz") as response:
            assert response.status == 404  # not on the public listener


async def test_readyz_names_a_backend_without_a_healthy_replica(
    http: aiohttp.ClientSession, tmp_path: Path, report_backends: list[BackendProcess]
) -> None:
    (dead_port,) = free_ports(1)
    config = {
        "backends": {
            "reports": {"replicas": [report_backends[0].url]},
            "gone": {"replicas": [f"http://127.0.0.1:{dead_port}/mcp"]},
        },
        "routes": [{"tools": ["echo"], "backend": "reports"}, {"tools": ["*"], "backend": "gone"}],
        "health": {"interval_s": 0.2, "timeout_s": 0.5, "unhealthy_after": 1},
    }
    async with taskgate(tmp_path, config) as gateway:
        ready = await poll_until(
            lambda: readyz(http, gateway), lambda body: body["status"] == 503, within=10
        )
        assert ready["backends"]["gone"] == {"healthy": 0, "replicas": 1}
        assert ready["backends"]["reports"] == {"healthy": 1, "replicas": 1}
        assert ready["store"] == "ok"


async def test_readyz_reports_the_store_and_tasks_get_the_retryable_error_while_redis_is_down(
    http: aiohttp.ClientSession, tmp_path: Path, report_backends: list[BackendProcess]
) -> None:
    with RedisProcess() as redis:
        config = {**reports(report_backends), "store": {"url": redis.url, "timeout_s": 0.5}}
        async with taskgate(tmp_path, config) as gateway:
            assert (await readyz(http, gateway))["ready"] is True
            redis.stop()
            ready = await readyz(http, gateway)
            assert ready["status"] == 503
            assert ready["store"].startswith("unavailable")
            get = build_request("tasks/get", {"taskId": "any-task"}, id=1)
            answer = await post_raw(http, gateway.url, get)
            assert answer.status == 503
            assert answer.headers["Retry-After"] == "1"
            assert answer.message["error"]["data"] == {"retryable": True}
            create = build_request(
                "tools/call", {"name": "generate_report", "arguments": {"size": "s"}}, id=2
            )
            refused = await post_raw(http, gateway.url, create)
            assert refused.status == 503  # no unrecorded task id escapes
            assert b"taskId" not in refused.raw
            plain = build_request("tools/call", {"name": "echo", "arguments": {"text": "up"}}, id=3)
            still = await post_raw(http, gateway.url, plain)
            assert still.message["result"]["structuredContent"] == {"result": "up"}
            redis.restart()
            await poll_until(
                lambda: readyz(http, gateway), lambda body: body["ready"] is True, within=15
            )


async def test_sigterm_lets_a_call_in_flight_finish_and_refuses_new_ones(
    http: aiohttp.ClientSession, tmp_path: Path, report_backends: list[BackendProcess]
) -> None:
    async with taskgate(tmp_path, reports(report_backends)) as gateway:
        params = {"name": "slow_count", "arguments": {"n": 8, "delay_ms": 150}}
        call = asyncio.create_task(
            post_raw(http, gateway.url, build_request("tools/call", params, id=7))
        )
        await poll_until(
            lambda: readyz(http, gateway), lambda body: body["in_flight"] == 1, within=10
        )
        assert gateway._proc is not None
        gateway._proc.send_signal(signal.SIGTERM)
        draining = await poll_until(
            lambda: readyz(http, gateway), lambda body: body["draining"] is True, within=10
        )
        assert draining["status"] == 503
        answer = await call
        assert answer.status == 200
        assert answer.message["result"]["structuredContent"] == {"result": 8}
        assert await asyncio.to_thread(gateway._proc.wait, 15) == 0


async def test_beyond_the_in_flight_limit_requests_are_refused_at_once(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream
) -> None:
    def hangs_seen() -> int:
        calls = [orjson.loads(seen["body"]) for seen in echo_upstream.app[SEEN]]
        return sum(c["method"] == "tools/call" and c["params"]["name"] == "hang" for c in calls)

    async def probe() -> int:
        return hangs_seen()

    for listen, per_backend in (({"max_in_flight": 2}, 256), (None, 2)):
        config = gateway_config(
            {"echo": [echo_upstream.url]},
            [(["*"], "echo")],
            listen=listen,
            backend_options={"echo": {"max_in_flight": per_backend}},
        )
        async with running_gateway(config) as url:
            before = hangs_seen()
            hang = build_request("tools/call", {"name": "hang", "arguments": {}}, id=1)
            hanging = [asyncio.create_task(post_raw(http, url, hang)) for _ in range(2)]
            # Both reached the upstream and wait there: the two slots are taken.
            await poll_until(probe, partial(operator.le, before + 2), within=10)
            answer = await post_raw(http, url, hang)
            assert answer.status == 503
            assert answer.headers["Retry-After"] == "1"
            assert answer.message["error"]["data"] == {"retryable": True}
            for task in hanging:
                task.cancel()
            await asyncio.gather(*hanging, return_exceptions=True)


async def test_a_client_that_trickles_its_body_gets_408(echo_upstream: EchoUpstream) -> None:
    config = gateway_config(
        {"echo": [echo_upstream.url]}, [(["*"], "echo")], listen={"read_timeout_s": 0.3}
    )
    async with running_gateway(config) as url:
        host, port = url.removeprefix("http://").split("/")[0].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        headers = mcp_headers("tools/list", {})
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(
            f"POST /mcp HTTP/1.1\r\nHost: {host}\r\n{head}Content-Length: 500\r\n\r\n{{".encode()
        )
        await writer.drain()
        async with asyncio.timeout(10):
            status_line = await reader.readline()
            rest = await reader.read(4096)
        writer.close()
        assert b" 408 " in status_line
        assert b'"code":-32600' in rest


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        ({"X-Big": "x" * 9000}, 431),
        ({f"X-Many-{n}": "v" for n in range(120)}, 431),
    ],
)
async def test_oversized_or_too_many_headers_get_a_json_rpc_error(
    http: aiohttp.ClientSession,
    tmp_path: Path,
    report_backends: list[BackendProcess],
    extra: dict[str, str],
    status: int,
) -> None:
    async with taskgate(tmp_path, reports(report_backends)) as gateway:
        body = build_request("tools/list", {}, id=1)
        answer = await post_raw(http, gateway.url, body, headers=extra)
        assert answer.status == status
        assert answer.headers["Content-Type"].startswith("application/json")
        assert answer.message["error"]["code"] == -32600
        assert b"xxxx" not in answer.raw  # the offending bytes are not echoed


async def test_a_replica_that_keeps_failing_is_ejected_and_comes_back_when_healthy(
    http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    flaky = BackendProcess("flaky").start()
    steady = BackendProcess("steady").start()
    try:
        config = {
            **reports([flaky, steady]),
            "health": {"interval_s": 0.2, "timeout_s": 0.5, "unhealthy_after": 2},
        }
        async with taskgate(tmp_path, config) as gateway:
            flaky.kill()
            ejected = await poll_until(
                lambda: readyz(http, gateway),
                lambda body: body["backends"]["reports"]["healthy"] == 1,
                within=10,
            )
            assert ejected["ready"] is True  # one healthy replica is enough
            for _ in range(4):  # new calls go to the healthy replica only
                call = build_request(
                    "tools/call", {"name": "whoami", "arguments": {}}, id=next(ids)
                )
                answer = await post_raw(http, gateway.url, call)
                assert answer.message["result"]["structuredContent"] == {"replica": "steady"}
            flaky.restart()
            await poll_until(
                lambda: readyz(http, gateway),
                lambda body: body["backends"]["reports"]["healthy"] == 2,
                within=15,
            )
    finally:
        flaky.stop()
        steady.stop()


async def test_a_cached_route_still_answers_its_owner_while_redis_is_down(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess]
) -> None:
    with RedisProcess() as redis:
        config = gateway_config(
            {"reports": [b.url for b in report_backends]},
            [(REPORT_TOOLS, "reports")],
            store=redis.url,
        )
        async with running_gateway(config) as url:
            create = build_request(
                "tools/call", {"name": "generate_report", "arguments": {"size": "s"}}, id=1
            )
            task_id = (await post_raw(http, url, create)).message["result"]["taskId"]
            redis.stop()
            get = build_request("tasks/get", {"taskId": task_id}, id=2)
            answer = await post_raw(http, url, get)
            assert answer.status == 200
            assert answer.message["result"]["taskId"] == task_id
            unknown = build_request("tasks/get", {"taskId": "not-cached"}, id=3)
            assert (await post_raw(http, url, unknown)).status == 503
