"""What an operator sees of real traffic: /metrics, the request log, the recent failures.

taskgate in front of the two report replicas, with JWT auth (a real issuer on loopback) so that
tenants and token-cache counts are real; every number asserted is one the traffic made.
"""

from __future__ import annotations

import itertools
import signal
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import Config
from gateway.observe.access import FIELDS, task_hash
from tests.gateway.conftest import EchoUpstream, leave_mid_call
from tests.gateway.test_cli import read_until, taskgate, two_workers
from tests.support.gateway import gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth, running_issuer
from tests.support.mcp import build_request, mcp_post, poll_until, post_raw
from tests.support.procs import BackendProcess, free_ports, start_backends, stop_all

ids = itertools.count(70_000)
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def config(issuer: Issuer, backends: list[BackendProcess], **sections: Any) -> Config:
    return Config.model_validate(
        {
            "listen": {"host": "127.0.0.1", "port": 0},
            "store": {"url": "sqlite:///:memory:"},
            "auth": jwt_auth(issuer),
            "admin": {"host": "127.0.0.1", "port": 0},
            "backends": {"reports": {"replicas": [b.url for b in backends]}},
            "routes": [{"tools": ["generate_report", "echo"], "backend": "reports"}],
            **sections,
        }
    )


@pytest.fixture
async def issuer() -> Any:
    async with running_issuer("ES256") as running:
        yield running


async def call(
    http: aiohttp.ClientSession,
    url: str,
    token: str,
    method: str,
    params: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> Any:
    body = build_request(method, params, id=next(ids))
    return await post_raw(
        http, url, body, headers={"Authorization": f"Bearer {token}", **(headers or {})}
    )


async def scrape(http: aiohttp.ClientSession, admin_url: str) -> tuple[str, Samples]:
    async with http.get(f"{admin_url}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return text, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_count_real_traffic_with_bounded_labels(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    token = issuer.token(tenant="acme", subject="alice")
    async with serving(config(issuer, report_backends)) as gateway:
        assert gateway.admin_url is not None
        for _ in range(3):
            answer = await call(
                http,
                gateway.url,
                token,
                "tools/call",
                {"name": "echo", "arguments": {"text": "hi"}},
            )
            assert answer.status == 200
        # A task: created, then polled twice by its owner; then a made-up id
        created = await call(
            http,
            gateway.url,
            token,
            "tools/call",
            {"name": "generate_report", "arguments": {"size": "small"}},
        )
        task_id = created.message["result"]["taskId"]
        for _ in range(2):
            polled = await call(http, gateway.url, token, "tasks/get", {"taskId": task_id})
            assert polled.status == 200
        unknown = await call(http, gateway.url, token, "tasks/get", {"taskId": "no-such-task"})
        assert unknown.message["error"]["code"] == -32602
        nameless = await call(http, gateway.url, token, "tools/call", {"name": "not_routed"})
        assert nameless.message["error"]["code"] == -32602
        async with http.post(gateway.url, data=b"{}") as refused:  # no token
            assert refused.status == 401

        text, samples = await scrape(http, gateway.admin_url)

    requests = "taskgate_requests_total"
    ok = {"status": "200", "rpc_code": "ok", "backend": "reports"}
    assert value(samples, requests, method="tools/call", **ok) == 4  # 3 echo + 1 created task
    assert value(samples, requests, method="tasks/get", **ok) == 2
    # taskgate's own not-found: no backend answered it
    assert (
        value(
            samples,
            requests,
            method="tasks/get",
            status="200",
            rpc_code="invalid_params",
            backend="",
        )
        == 1
    )
    assert (
        value(
            samples,
            requests,
            method="tools/call",
            status="200",
            rpc_code="invalid_params",
            backend="",
        )
        == 1
    )
    assert value(
        samples, requests, method="-", status="401", rpc_code="invalid_request", backend=""
    ) == 1 or (
        value(samples, requests, method="-", status="401", rpc_code="internal_error", backend="")
        == 1
    )
    assert value(samples, "taskgate_request_duration_seconds_count", method="tasks/get") == 3
    assert value(samples, "taskgate_upstream_duration_seconds_count", backend="reports") == 6
    assert value(samples, "taskgate_task_routes_total", outcome="recorded") == 1
    assert value(samples, "taskgate_task_routes_total", outcome="found") == 2
    assert value(samples, "taskgate_task_routes_total", outcome="not_found") == 1
    assert value(samples, "taskgate_store_duration_seconds_count", operation="record") == 1
    assert value(samples, "taskgate_requests_in_flight") == 0
    for backend in report_backends:
        replica = backend.url.split("/")[2]
        assert value(samples, "taskgate_replica_healthy", backend="reports", replica=replica) == 1
    hits = value(samples, "taskgate_token_cache_total", result="hit")
    misses = value(samples, "taskgate_token_cache_total", result="miss")
    assert (hits, misses) == (7, 1)  # one token: verified once, then remembered
    assert value(samples, "taskgate_jwks_refreshes_total", result="ok") == 1
    # Labels never carry a task id, a tenant, a principal or a name a client made up.
    for secret in (task_id, "acme", "alice", "not_routed", "no-such-task", token):
        assert secret not in text


async def test_one_request_log_line_per_request_json_and_hashed(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    capsys: pytest.CaptureFixture[str],
) -> None:
    token = issuer.token(tenant="acme", subject="alice")
    settings = config(issuer, report_backends, logging={"format": "json"})
    async with serving(settings) as gateway:
        task_id = await create_report_as(http, gateway.url, token)
        await call(
            http, gateway.url, token, "tasks/get", {"taskId": task_id}, {"traceparent": TRACEPARENT}
        )
        await call(http, gateway.url, token, "tasks/get", {"taskId": "no-such-task"})
    lines = [
        orjson.loads(line)
        for line in capsys.readouterr().err.splitlines()
        if '"taskgate.access"' in line
    ]
    assert len(lines) == 3
    for line in lines:
        assert tuple(k for k in line if k not in ("level", "logger")) == FIELDS
    created, polled, unknown = lines
    assert (created["method"], created["status"], created["rpc_code"]) == ("tools/call", 200, None)
    assert created["backend"] == "reports"
    assert created["replica"] in {b.url.split("/")[2] for b in report_backends}
    assert polled["task"] == task_hash(task_id)
    assert polled["trace_id"] == TRACE
    assert polled["replica"] == created["replica"]
    assert polled["tenant"] == "acme"
    assert polled["duration_ms"] >= polled["upstream_ms"] > 0
    assert (unknown["rpc_code"], unknown["backend"], unknown["task"]) == (
        -32602,
        None,
        task_hash("no-such-task"),
    )
    raw = capsys.readouterr().err
    assert task_id not in raw
    assert token not in raw


async def test_text_request_log_and_access_false(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    capsys: pytest.CaptureFixture[str],
) -> None:
    token = issuer.token(tenant="acme", subject="alice")
    async with serving(config(issuer, report_backends)) as gateway:
        task_id = await create_report_as(http, gateway.url, token)
        await call(http, gateway.url, token, "tasks/get", {"taskId": task_id})
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if " taskgate.access " in line]
    assert len(lines) == 2
    assert " method=tasks/get status=200 rpc_code=- backend=reports " in lines[1]
    assert f" tenant=acme task={task_hash(task_id)} trace_id=-" in lines[1]
    assert task_id not in err

    async with serving(config(issuer, report_backends, logging={"access": False})) as gateway:
        await call(
            http, gateway.url, token, "tools/call", {"name": "echo", "arguments": {"text": "x"}}
        )
    assert "taskgate.access" not in capsys.readouterr().err


async def create_report_as(http: aiohttp.ClientSession, url: str, token: str) -> str:
    answer = await call(
        http, url, token, "tools/call", {"name": "generate_report", "arguments": {"size": "small"}}
    )
    return str(answer.message["result"]["taskId"])


async def test_recent_failures_are_kept_without_task_ids(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    token = issuer.token()
    async with serving(config(issuer, report_backends, logging={"recent_errors": 2})) as gateway:
        for name in ("a", "b", "c"):
            await call(http, gateway.url, token, "tools/call", {"name": name})
        failures = list(gateway.state.observer.failures)
    assert [f.message for f in failures] == ["Unknown tool: b", "Unknown tool: c"]
    assert {(f.method, f.status, f.code, f.tenant) for f in failures} == {
        ("tools/call", 200, -32602, "acme")
    }


async def test_with_workers_one_scrape_and_one_readyz_see_every_worker(
    tmp_path: Path, report_backends: list[BackendProcess]
) -> None:
    with two_workers(tmp_path, report_backends) as (proc, port, admin):
        admin_url = f"http://127.0.0.1:{admin}"
        url = f"http://127.0.0.1:{port}/mcp"
        params = {"name": "echo", "arguments": {"text": "hi"}}
        for n in range(20):
            # A fresh connection each time, so the kernel spreads them over the workers.
            async with aiohttp.ClientSession() as fresh:
                status, _ = await mcp_post(fresh, url, "tools/call", params, id=n)
                assert status == 200
        async with aiohttp.ClientSession() as http:

            async def counted() -> tuple[float, float]:
                _, samples = await scrape(http, admin_url)
                calls = value(
                    samples,
                    "taskgate_requests_total",
                    method="tools/call",
                    status="200",
                    rpc_code="ok",
                    backend="reports",
                )
                return calls, value(samples, "taskgate_workers")

            # The other worker publishes each second: the total arrives within a few.
            assert await poll_until(counted, lambda seen: seen == (20, 2), within=15) == (20, 2)
            async with http.get(f"{admin_url}/readyz") as response:
                ready = await response.json()
                assert response.status == 200
            assert [w["worker"] for w in ready["workers"]] == [0, 1]
            assert all(w["ready"] for w in ready["workers"])
            assert len({w["pid"] for w in ready["workers"]}) == 2
            async with http.get(f"{admin_url}/readyz?worker=1") as response:
                assert response.status == 200
                assert (await response.json())["worker"] == 1
            async with http.get(f"{admin_url}/readyz?worker=7") as response:
                assert response.status == 404
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


async def test_a_task_its_restarted_owner_forgot_answers_as_unknown_and_the_log_says_who(
    http: aiohttp.ClientSession, issuer: Issuer, capsys: pytest.CaptureFixture[str]
) -> None:
    token = issuer.token(tenant="acme", subject="alice")
    (owner,) = start_backends(["forgetful"])
    replica = owner.url.split("/")[2]
    try:
        async with serving(config(issuer, [owner])) as gateway:
            task_id = await create_report_as(http, gateway.url, token)
            owner.restart()  # its tasks lived in its memory
            forgotten = await call(http, gateway.url, token, "tasks/get", {"taskId": task_id})
            made_up = await call(http, gateway.url, token, "tasks/get", {"taskId": "made-up"})
            outcomes = dict(gateway.state.tasks.outcomes)
    finally:
        stop_all([owner])
    # docs/tasks.md's one answer for a task that does not exist, byte for byte
    assert forgotten.status == made_up.status == 200
    assert forgotten.message["error"] == {"code": -32602, "message": "Task not found"}
    assert forgotten.raw.replace(b'"id":' + str(forgotten.message["id"]).encode(), b"") == (
        made_up.raw.replace(b'"id":' + str(made_up.message["id"]).encode(), b"")
    )
    assert outcomes["owner_lost"] == 1
    # ...and the operator's witness: the owner answered one, taskgate's own the other.
    lines = [line for line in capsys.readouterr().err.splitlines() if "taskgate.access" in line]
    polls = [line for line in lines if "method=tasks/get" in line]
    assert f"rpc_code=-32602 backend=reports replica={replica} " in polls[0]
    assert f"task={task_hash(task_id)}" in polls[0]
    assert "rpc_code=-32602 backend=- replica=- " in polls[1]


async def test_with_format_json_every_line_taskgate_run_writes_is_json(
    tmp_path: Path, report_backends: list[BackendProcess]
) -> None:
    (port,) = free_ports(1)
    path = tmp_path / "taskgate.yaml"
    path.write_text(
        f"listen: {{host: 127.0.0.1, port: {port}}}\n"
        "logging: {format: json}\n"
        f"backends:\n  reports: {{replicas: ['{report_backends[0].url}']}}\n"
        "routes:\n  - {tools: ['*'], backend: reports}\n"
    )
    with taskgate("run", "--config", str(path)) as proc:
        read_until(proc, "listening on http://")
        async with aiohttp.ClientSession() as http:
            params = {"name": "echo", "arguments": {"text": "hi"}}
            url = f"http://127.0.0.1:{port}/mcp"
            status, _ = await mcp_post(http, url, "tools/call", params, id=1)
            assert status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stdout is not None
        rest = proc.stdout.read()
    lines = [orjson.loads(line) for line in rest.splitlines() if line]
    assert {line["logger"] for line in lines} >= {"taskgate", "taskgate.access"}
    assert all(line["time"].endswith("Z") and line["level"] for line in lines)
    (access,) = [line for line in lines if line["logger"] == "taskgate.access"]
    assert (access["method"], access["status"], access["backend"]) == ("tools/call", 200, "reports")


async def test_a_client_that_leaves_is_logged_and_counted_499(
    http: aiohttp.ClientSession, echo_upstream: EchoUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    config = gateway_config({"echo": [echo_upstream.url]}, [(["*"], "echo")])
    async with serving(config) as gateway:
        await leave_mid_call(http, gateway.url, echo_upstream)

        async def left() -> int:
            key = ("tools/call", 499, "ok", "echo")
            return gateway.state.observer.metrics.requests.get(key, 0)

        assert await poll_until(left, lambda count: count == 1, within=10) == 1
        (failure,) = gateway.state.observer.failures
    assert failure.message == "the client left before its answer"
    lines = [line for line in capsys.readouterr().err.splitlines() if "taskgate.access" in line]
    assert any(" method=tools/call status=499 " in line for line in lines)
