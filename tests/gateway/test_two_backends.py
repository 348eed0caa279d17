"""Two backends behind one taskgate, two tenants: every answer comes from the backend the
first visible route names, byte for byte as that backend sends it; discovery and
`taskgate check --discover` name the items two backends serve and the ones a route shadows; a
backend's own unknown-prompt answer reads like taskgate's (issue 12, items 1, 3, 4 and 6).

The backends are the report server twice: `reports` (the two shared replicas) and `archive`
(one replica of its own, with three numbered `bulk_*` prompts and resources besides the report
ones). Every answer names its replica, so the bytes tell which backend answered.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.mcp import Answer, result_of
from tests.support.mcp import mcp_call as post
from tests.support.procs import BackendProcess, free_ports

ids = itertools.count(90_000)

# globex's greeting, about page and whoami come from archive; acme's from reports. report_chart
# is named for archive too, after the report_* glob: shadowed for everyone.
ROUTES: list[tuple[list[str], str] | dict[str, Any]] = [
    {"prompts": ["report_greeting"], "backend": "archive", "tenants": ["globex"]},
    {"prompts": ["report_*"], "backend": "reports"},
    {"prompts": ["bulk_*", "report_chart"], "backend": "archive"},
    {"resources": ["reports://about"], "backend": "archive", "tenants": ["globex"]},
    {"resources": ["reports://about", "reports://logo.png"], "backend": "reports"},
    {"resources": ["reports://bulk/*"], "backend": "archive"},
    {"tools": ["whoami"], "backend": "archive", "tenants": ["globex"]},
    {"tools": ["whoami", "echo"], "backend": "reports"},
]

# tenant -> the backend whose bytes each routed item must be
SOURCE = {"acme": "reports", "globex": "archive"}
BULK = ["bulk_0000", "bulk_0001", "bulk_0002"]


@pytest.fixture(scope="module")
def archive() -> Iterator[BackendProcess]:
    with BackendProcess("archive", extra_args=("--many", "3")) as backend:
        yield backend


def backend_urls(report_backends: list[BackendProcess], archive: BackendProcess) -> dict[str, Any]:
    return {"reports": [b.url for b in report_backends], "archive": [archive.url]}


@pytest.fixture
async def gateway(
    issuer: Issuer, report_backends: list[BackendProcess], archive: BackendProcess
) -> AsyncIterator[RunningGateway]:
    config = gateway_config(
        backend_urls(report_backends, archive),
        ROUTES,
        auth=jwt_auth(issuer),
        discovery={"refresh_s": 30},
    )
    async with serving(config) as running:
        yield running


async def direct(
    http: aiohttp.ClientSession, backends: list[BackendProcess], method: str, params: Any, id: int
) -> dict[bytes, str]:
    """Each replica's answer bytes to the same request, mapped to the replica's name."""
    answers = [await post(http, b.url, method, params, id=id) for b in backends]
    return {answer.raw: backend.name for answer, backend in zip(answers, backends, strict=True)}


async def through(
    http: aiohttp.ClientSession, gateway: RunningGateway, issuer: Issuer, tenant: str, **call: Any
) -> Answer:
    return await post(http, gateway.url, token=issuer.token(tenant, "ann"), **call)


@pytest.mark.parametrize("tenant", ["acme", "globex"])
@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("prompts/get", {"name": "report_greeting"}),
        ("resources/read", {"uri": "reports://about"}),
        ("tools/call", {"name": "whoami", "arguments": {}}),
    ],
)
async def test_each_tenant_gets_the_bytes_of_the_backend_its_first_visible_route_names(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    report_backends: list[BackendProcess],
    archive: BackendProcess,
    tenant: str,
    method: str,
    params: dict[str, Any],
) -> None:
    request_id = next(ids)
    by_backend = {
        "reports": await direct(http, report_backends, method, params, request_id),
        "archive": await direct(http, [archive], method, params, request_id),
    }
    for _ in range(3):  # whichever replica answers, its bytes are the whole answer
        answer = await through(
            http, gateway, issuer, tenant, method=method, params=params, id=request_id
        )
        assert answer.status == 200
        assert answer.raw in by_backend[SOURCE[tenant]], answer.raw


@pytest.mark.parametrize("tenant", ["acme", "globex"])
async def test_the_merged_lists_hold_each_routed_item_once_as_its_backend_lists_it(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    report_backends: list[BackendProcess],
    archive: BackendProcess,
    tenant: str,
) -> None:
    prompts = result_of(
        (await through(http, gateway, issuer, tenant, method="prompts/list")).message
    )
    names = [p["name"] for p in prompts["prompts"]]
    first = ["report_greeting"] if tenant == "globex" else []
    rest = ["report_chart", "report_embedded", "report_summarize"]
    rest += [] if tenant == "globex" else ["report_greeting"]
    assert names == first + sorted(rest) + BULK
    listed = {
        backend.name: result_of((await post(http, backend.url, "prompts/list")).message)
        for backend in (report_backends[0], archive)
    }
    for prompt in prompts["prompts"]:
        source = "archive" if prompt["name"] in BULK or first == [prompt["name"]] else "r1"
        assert prompt in listed[source]["prompts"]

    resources = result_of(
        (await through(http, gateway, issuer, tenant, method="resources/list")).message
    )
    uris = [r["uri"] for r in resources["resources"]]
    about = ["reports://about"]
    expected = (about if tenant == "globex" else []) + sorted(
        ["reports://logo.png"] + ([] if tenant == "globex" else about)
    )
    assert uris == expected + [f"reports://bulk/{n}" for n in ("0000", "0001", "0002")]


async def test_discovery_names_items_two_backends_serve_and_items_a_route_shadows(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await through(http, gateway, issuer, "acme", method="tools/list")  # both backends looked at
    warnings = gateway.state.catalog.warnings()
    assert (
        "prompt 'report_chart' of backend 'archive' is shadowed: routes[2] never reaches it, "
        "routes[1] (backend 'reports') matches it first"
    ) in warnings
    assert (
        "prompt 'report_greeting' is served by backends 'archive' and 'reports': "
        "routes[0] to 'archive' for tenants globex; routes[1] to 'reports' for every tenant"
    ) in warnings
    assert (
        "tool 'whoami' is served by backends 'archive' and 'reports': "
        "routes[6] to 'archive' for tenants globex; routes[7] to 'reports' for every tenant"
    ) in warnings
    assert any(w.startswith("resource 'reports://about' is served by") for w in warnings)
    # Items one backend serves, or that only one backend's routes reach, are not named.
    assert not any("bulk_" in w or "echo" in w or "report_embedded" in w for w in warnings)
    # The log says each once, however many refreshes see it.
    logged = [r.getMessage() for r in caplog.records if r.name == "taskgate.discovery"]
    for warning in warnings:
        assert logged.count(warning) == 1, warning


async def test_a_prompt_the_backend_no_longer_serves_answers_like_one_that_never_existed(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    archive: BackendProcess,
) -> None:
    listed = await through(http, gateway, issuer, "acme", method="prompts/list")
    assert "bulk_0001" in [p["name"] for p in result_of(listed.message)["prompts"]]
    hide = {"kind": "prompt", "name": "bulk_0001", "on": False}
    await post(http, archive.url, "tools/call", {"name": "set_visible", "arguments": hide})
    try:
        # taskgate's catalogue still lists it (refresh_s 30); the backend refuses it.
        backend = await post(http, archive.url, "prompts/get", {"name": "bulk_0001"})
        assert backend.status == 400
        assert backend.message["error"]["message"] == "Unknown prompt: 'bulk_0001'"
        gone = await through(
            http, gateway, issuer, "acme", method="prompts/get", params={"name": "bulk_0001"}, id=7
        )
        never = await through(
            http, gateway, issuer, "acme", method="prompts/get", params={"name": "bulk_9999"}, id=7
        )
    finally:
        show = {**hide, "on": True}
        await post(http, archive.url, "tools/call", {"name": "set_visible", "arguments": show})
    assert gone.status == never.status == 200
    assert gone.message == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {"code": -32602, "message": "Unknown prompt: bulk_0001"},
    }
    assert never.raw == gone.raw.replace(b"bulk_0001", b"bulk_9999")


async def test_a_prompts_argument_error_from_the_backend_is_relayed_not_normalised(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway, archive: BackendProcess
) -> None:
    params = {"name": "bulk_0002", "arguments": {"unexpected": 1}}
    backend = await post(http, archive.url, "prompts/get", params, id=8)
    answer = await through(http, gateway, issuer, "acme", method="prompts/get", params=params, id=8)
    assert (answer.status, answer.raw) == (backend.status, backend.raw)


async def run_check(tmp_path: Path, backends: dict[str, Any]) -> tuple[int, str]:
    config = {
        "listen": {"host": "127.0.0.1", "port": 8080},
        "store": {"url": "sqlite:///:memory:"},
        "backends": {name: {"replicas": urls} for name, urls in backends.items()},
        "routes": ROUTES,
    }
    path = tmp_path / "taskgate.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "check",
        "--config",
        str(path),
        "--discover",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, stderr.decode()


async def test_check_discover_names_the_same_items_and_fails_when_a_backend_is_silent(
    tmp_path: Path, report_backends: list[BackendProcess], archive: BackendProcess
) -> None:
    code, stderr = await run_check(tmp_path, backend_urls(report_backends, archive))
    assert code == 0, stderr
    warnings = [line for line in stderr.splitlines() if line.startswith("taskgate: warning: ")]
    assert (
        "taskgate: warning: prompt 'report_chart' of backend 'archive' is shadowed: routes[2] "
        "never reaches it, routes[1] (backend 'reports') matches it first"
    ) in warnings
    assert any(
        "'report_greeting' is served by backends 'archive' and 'reports'" in w for w in warnings
    )
    assert not any("did not answer" in line for line in warnings)

    (closed,) = free_ports(1)
    silent = backend_urls(report_backends, archive) | {
        "archive": [f"http://127.0.0.1:{closed}/mcp"]
    }
    code, stderr = await run_check(tmp_path, silent)
    assert code == 1
    assert "taskgate: warning: backend 'archive' did not answer discovery" in stderr
