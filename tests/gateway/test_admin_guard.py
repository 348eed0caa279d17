"""The admin listener against a web page the operator opens: forged Host (DNS rebinding) and
Origin, cross-site POSTs, and what stays open (the probes) and keeps working (`taskgate reload`).

taskgate runs in this process from a configuration file (so that it can reload it), with its
admin listener on a fixed loopback port without a token, as `admin: {host: 127.0.0.1}` runs by
default; a real aiohttp client sends the attacker's requests, header for header.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from gateway.config import load_config
from gateway.process.serve import Running, Source, running
from tests.gateway.test_reload import taskgate_reload
from tests.support.issuer import Issuer, jwt_auth, running_issuer
from tests.support.mcp import Answer, build_request, post_raw
from tests.support.procs import BackendProcess, free_ports

EVIL_HOST = "evil.example.com"
EVIL_ORIGIN = "http://evil.example.com"
ids = itertools.count(95_000)


@pytest.fixture
async def issuer() -> Any:
    async with running_issuer("ES256") as running_one:
        yield running_one


def document(
    issuer: Issuer, backends: list[BackendProcess], tools: list[str], **admin: Any
) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "store": {"url": "sqlite:///:memory:"},
        "auth": jwt_auth(issuer),
        "admin": {"host": "127.0.0.1", **admin},
        "backends": {"reports": {"replicas": [b.url for b in backends]}},
        "routes": [{"tools": tools, "backend": "reports"}],
    }


def write(path: Path, content: dict[str, Any]) -> Source:
    path.write_text(yaml.safe_dump(content))
    return Source(str(path), path.read_bytes())


@asynccontextmanager
async def from_file(path: Path, content: dict[str, Any]) -> AsyncIterator[Running]:
    """taskgate in this process, started from `path` holding `content`."""
    source = write(path, content)
    async with running(load_config(path), source=source, drain_timeout_s=0) as process:
        yield process


async def call(
    http: aiohttp.ClientSession, url: str, token: str, tool: str, arguments: dict[str, Any]
) -> Answer:
    body = build_request("tools/call", {"name": tool, "arguments": arguments}, id=next(ids))
    return await post_raw(http, url, body, headers={"Authorization": f"Bearer {token}"})


async def get(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    async with http.get(url, headers=headers or {}) as response:
        return response.status, await response.text()


async def test_a_rebound_host_or_a_foreign_origin_reads_no_task_route_metrics_or_status_page(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    tmp_path: Path,
) -> None:
    (admin_port,) = free_ports(1)
    token = issuer.token(tenant="acme", subject="alice")
    content = document(issuer, report_backends, ["generate_report"], port=admin_port)
    async with from_file(tmp_path / "taskgate.yaml", content) as process:
        created = await call(http, process.url, token, "generate_report", {"size": "small"})
        task_id = created.message["result"]["taskId"]
        admin = f"http://127.0.0.1:{admin_port}"
        paths = (f"/tasks/{task_id}", "/metrics", "/")

        # The operator's own requests (a loopback Host, no Origin) are answered.
        status, text = await get(http, admin + paths[0])
        assert status == 200
        assert orjson.loads(text)["tenant"] == "acme"
        for path in paths[1:]:
            assert (await get(http, admin + path))[0] == 200

        # A page on evil.example.com whose name now resolves to 127.0.0.1 (DNS rebinding).
        for path in paths:
            status, text = await get(http, admin + path, {"Host": EVIL_HOST})
            assert status == 403, path
            assert "Host" in text
            assert "acme" not in text
            assert "alice" not in text
        # The same page, fetching 127.0.0.1 directly: its Origin says who asks.
        for path in paths:
            status, text = await get(http, admin + path, {"Origin": EVIL_ORIGIN})
            assert status == 403, path
            assert "Origin" in text
            assert "acme" not in text


async def test_a_cross_site_post_does_not_reload_and_taskgate_reload_still_does(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    tmp_path: Path,
) -> None:
    (admin_port,) = free_ports(1)
    token = issuer.token(tenant="acme", subject="alice")
    path = tmp_path / "taskgate.yaml"
    async with from_file(path, document(issuer, report_backends, ["echo"], port=admin_port)) as p:
        history = p.state.history
        version = history.version
        edited = document(issuer, report_backends, ["echo", "whoami"], port=admin_port)
        write(path, edited)  # what a reload would now apply
        reload_url = f"http://127.0.0.1:{admin_port}/reload"

        async def post(headers: dict[str, str]) -> tuple[int, str]:
            # A form or fetch() with text/plain needs no preflight: the browser sends it as is.
            sent = {"Content-Type": "text/plain", **headers}
            async with http.post(reload_url, data=b"reload", headers=sent) as response:
                return response.status, await response.text()

        status, text = await post({"Origin": EVIL_ORIGIN})
        assert status == 403
        assert "Origin" in text
        status, text = await post({"Host": EVIL_HOST})  # rebound: same-origin to the browser
        assert status == 403
        assert "Host" in text
        status, text = await post({})  # a loopback Host, no Origin, no X-Taskgate-Admin
        assert status == 403
        assert "X-Taskgate-Admin: 1" in text
        # A custom header would mean a preflight, which the listener does not grant.
        status, _ = await post({"Origin": EVIL_ORIGIN, "X-Taskgate-Admin": "1"})
        assert status == 403

        assert history.version == version  # nothing was reloaded
        assert not history.reloads
        refused = await call(http, p.url, token, "whoami", {})
        assert refused.message["error"]["code"] == -32602  # still not routed

        code, output = await taskgate_reload(path)
        assert code == 0, output
        assert f"taskgate: reloaded {path} (version {history.version})" in output
        assert history.version != version
        routed = await call(http, p.url, token, "whoami", {})
        assert routed.message["result"]["structuredContent"]["replica"] in {"r1", "r2"}


async def test_probes_answer_any_host_and_any_origin(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    tmp_path: Path,
) -> None:
    (admin_port,) = free_ports(1)
    content = document(issuer, report_backends, ["echo"], port=admin_port)
    async with from_file(tmp_path / "taskgate.yaml", content):
        admin = f"http://127.0.0.1:{admin_port}"
        # The kubelet sends the pod's IP as Host; no probe is refused for its Host or Origin.
        for headers in ({"Host": "10.1.2.3:9090"}, {"Host": EVIL_HOST, "Origin": EVIL_ORIGIN}):
            assert (await get(http, admin + "/healthz", headers))[0] == 200
            status, text = await get(http, admin + "/readyz", headers)
            assert status == 200
            assert orjson.loads(text)["ready"] is True


async def test_the_configured_hosts_and_origins_pass_and_only_they(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    tmp_path: Path,
) -> None:
    (admin_port,) = free_ports(1)
    content = document(
        issuer,
        report_backends,
        ["echo"],
        port=admin_port,
        allowed_hosts=["taskgate.internal"],
        allowed_origins=["https://ops.example"],
    )
    async with from_file(tmp_path / "taskgate.yaml", content) as process:
        admin = f"http://127.0.0.1:{admin_port}"
        named = {"Host": f"taskgate.internal:{admin_port}"}
        assert (await get(http, admin + "/metrics", named))[0] == 200
        assert (await get(http, admin + "/metrics", {"Host": "other.internal"}))[0] == 403
        assert (await get(http, admin + "/", {"Origin": "https://ops.example"}))[0] == 200
        assert (await get(http, admin + "/", {"Origin": "https://ops.example.evil"}))[0] == 403

        # An empty JSON body with the header, from the configured Origin: applied.
        headers = {"Origin": "https://ops.example", "X-Taskgate-Admin": "1"}
        async with http.post(admin + "/reload", json={}, headers=headers) as response:
            assert response.status == 200
            assert (await response.json())["applied"] is True
        assert len(process.state.history.reloads) == 1
