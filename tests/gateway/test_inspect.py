"""The operator's look: `taskgate routes` prints the compiled table and what never wins;
`taskgate task inspect` prints a task's route, from the store or from the admin listener, whose
operator paths keep to their token."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.config import Config, load_config
from gateway.observe.access import task_hash
from gateway.ops.admin import make_admin_app
from gateway.ops.inspect import span, utc
from gateway.ops.inspect_task import NOT_FOUND, route_from_json, route_json
from gateway.process.app import gateway_state
from gateway.process.cli import main
from gateway.store.base import TaskRoute
from tests.gateway.test_cli import into_closed_pipe
from tests.support.gateway import gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.mcp import mcp_post, poll_until, result_of
from tests.support.procs import BackendProcess, free_ports

ROOT = Path(__file__).resolve().parents[2]
ADMIN_ENV = "TASKGATE_TEST_ADMIN_TOKEN"
ADMIN_TOKEN = "admin-secret-7f3a"
ids = itertools.count(70_000)

ROUTES_YAML = """\
backends:
  reports: {replicas: ["http://127.0.0.1:9/mcp"]}
  search: {replicas: ["http://127.0.0.1:10/mcp"]}
routes:
  - tools: [generate_report, "report_*"]
    prompts: [summarize]
    backend: reports
  - resources: ["reports://acme/*"]
    resource_templates: ["reports://acme/{id}"]
    backend: reports
    tenants: [beta, acme]
    scopes: [reports, read]
  - tools: [report_daily, "search_*"]
    backend: search
    tenants: [acme]
"""


def taskgate(*args: str) -> int:
    return main(list(args))


def inspect(path: Path, task_id: str, *options: str) -> list[str]:
    """`task inspect` with the id after `--`: a task id may begin with '-'."""
    return ["task", "inspect", "--config", str(path), *options, "--", task_id]


def stderr_lines(err: str) -> list[str]:
    """What the command said, without the request log lines of a gateway in the same test."""
    return [line for line in err.splitlines() if line.startswith("taskgate: ")]


# --- taskgate routes ----------------------------------------------------------------------


def test_routes_prints_the_table_per_item_and_the_shadowed_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "taskgate.yaml"
    path.write_text(ROUTES_YAML)

    assert taskgate("routes", "--config", str(path)) == 0

    out, err = capsys.readouterr()
    assert out == (
        "route  kind                pattern              backend  tenants    scopes\n"
        "0      tools               generate_report      reports  all        -\n"
        "0      tools               report_*             reports  all        -\n"
        "0      prompts             summarize            reports  all        -\n"
        "1      resources           reports://acme/*     reports  acme,beta  reports,read\n"
        "1      resource_templates  reports://acme/{id}  reports  acme,beta  reports,read\n"
        "2      tools               report_daily         search   acme       -\n"
        "2      tools               search_*             search   acme       -\n"
        "\n"
        "shadowed or overlapping, by the configuration:\n"
        "  routes[2].tools[0] 'report_daily' is shadowed: routes[0].tools[1] 'report_*' "
        "matches it first\n"
    )
    assert err == ""


def test_routes_discover_adds_what_the_backends_serve_and_fails_on_a_silent_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], report_backends: list[BackendProcess]
) -> None:
    (closed,) = free_ports(1)
    path = tmp_path / "taskgate.yaml"
    config = {
        "backends": {
            "reports": {"replicas": [b.url for b in report_backends]},
            "copy": {"replicas": [report_backends[0].url]},
            "gone": {"replicas": [f"http://127.0.0.1:{closed}/mcp"]},
        },
        "routes": [
            {"tools": ["echo"], "backend": "reports"},
            {"tools": ["echo", "whoami"], "backend": "copy"},
            {"tools": ["nothing"], "backend": "gone"},
        ],
    }
    path.write_text(json.dumps(config))

    assert taskgate("routes", "--config", str(path), "--discover") == 1

    out, err = capsys.readouterr()
    served, eras = out.split("shadowed or served twice, by what the backends serve:\n")[1].split(
        "what each replica speaks:\n"
    )
    assert served.splitlines() == [
        "  tool 'echo' of backend 'copy' is shadowed: routes[1] never reaches it, routes[0] "
        "(backend 'reports') matches it first",
        "  (backend 'gone' did not answer: its items are not here)",
    ]
    # Each replica asked, the one that answered nothing included.
    first, second = (urlsplit(b.url).netloc for b in report_backends)
    assert [line.split() for line in eras.splitlines()] == [
        ["reports", first, "2026-07-28"],
        ["reports", second, "2026-07-28"],
        ["copy", first, "2026-07-28"],
        ["gone", f"127.0.0.1:{closed}", "not", "known", "yet", "(era:", "auto)"],
    ]
    assert stderr_lines(err) == ["taskgate: warning: backend 'gone' did not answer discovery"]


def test_routes_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`taskgate routes | head`: the reader is gone before routes writes; no traceback."""
    path = tmp_path / "taskgate.yaml"
    path.write_text(ROUTES_YAML)
    done = into_closed_pipe("routes", "--config", str(path))
    assert (done.returncode, done.stderr) == (0, "")


# --- taskgate task inspect ------------------------------------------------------------------


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))  # JSON is YAML
    return path.resolve()


async def create_task(http: aiohttp.ClientSession, url: str, token: str | None = None) -> str:
    params = {"name": "generate_report", "arguments": {"size": "small"}}
    headers = {"Authorization": f"Bearer {token}"} if token else None
    status, response = await mcp_post(
        http, url, "tools/call", params, id=next(ids), headers=headers
    )
    assert status == 200, response
    return str(result_of(response)["taskId"])


def expected_lines(route: TaskRoute, source: str) -> list[str]:
    """Every line `task inspect` prints but the expiry's countdown."""
    ttl = (
        "unlimited (the route is kept for tasks.unlimited_ttl_cap_s)"
        if route.ttl_ms is None
        else f"{span(route.ttl_ms)} ({route.ttl_ms} ms)"
    )
    return [
        f"task       {task_hash(route.task_id)}  (as the request log shows it)",
        "backend    reports",
        f"replica    {route.replica}",
        "tenant     acme",
        "principal  alice",
        f"created    {utc(route.created_at_ms)}",
        f"expires    {utc(route.expires_at_ms)}  (in ",
        f"ttl        {ttl}",
        f"source     {source}",
    ]


def printed(out: str) -> list[str]:
    """The printed lines, the expiry cut before its countdown (which moves with the clock)."""
    lines = out.splitlines()
    return [
        line.split("(in ")[0] + "(in " if line.startswith("expires") else line for line in lines
    ]


async def test_task_inspect_prints_the_route_from_the_store_and_from_the_admin_listener(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    issuer: Issuer,
    report_backends: list[BackendProcess],
) -> None:
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    (admin_port,) = free_ports(1)
    path = write_config(
        tmp_path / "conf" / "taskgate.yaml",
        {
            "listen": {"host": "127.0.0.1", "port": 0},
            "store": {"url": "sqlite:///./routes.db"},  # beside the file, wherever the cwd
            "auth": jwt_auth(issuer),
            "admin": {"host": "127.0.0.1", "port": admin_port, "bearer_env": ADMIN_ENV},
            "backends": {"reports": {"replicas": [b.url for b in report_backends]}},
            "routes": [{"tools": ["generate_report"], "backend": "reports"}],
        },
    )
    async with serving(load_config(path)) as gateway, aiohttp.ClientSession() as http:
        task_id = await create_task(http, gateway.url, issuer.token("acme", "alice"))
        route = await gateway.state.tasks.store.lookup(task_id)
        assert route is not None
        # The hash the command prints is the one the request log shows.
        status, _ = await mcp_post(
            http,
            gateway.url,
            "tasks/get",
            {"taskId": task_id},
            id=next(ids),
            headers={"Authorization": f"Bearer {issuer.token('acme', 'alice')}"},
        )
        assert status == 200
        logged: list[str] = []

        async def log_so_far() -> str:  # the request log is written once the loop turns
            logged.append(capsys.readouterr().err)
            return "".join(logged)

        await poll_until(log_so_far, lambda text: f"task={task_hash(task_id)}" in text)

        assert await asyncio.to_thread(taskgate, *inspect(path, task_id)) == 0
        store = f"store sqlite:///{path.parent}/routes.db"
        assert printed(capsys.readouterr().out) == expected_lines(route, store)

        assert await asyncio.to_thread(taskgate, *inspect(path, task_id, "--admin")) == 0
        admin = f"admin listener http://127.0.0.1:{admin_port}"
        assert printed(capsys.readouterr().out) == expected_lines(route, admin)

        # The endpoint behind --admin, and its guard: the token set, it is required.
        assert gateway.admin_url == f"http://127.0.0.1:{admin_port}"
        tasks_url = f"{gateway.admin_url}/tasks/{task_id}"
        admin_auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with http.get(tasks_url, headers=admin_auth) as response:
            assert response.status == 200
            assert await response.json() == route_json(route)
        async with http.get(tasks_url) as response:
            assert response.status == 401
            assert response.headers["WWW-Authenticate"] == 'Bearer realm="taskgate-admin"'
        async with http.get(f"{gateway.admin_url}/tasks/no-such-task", headers=admin_auth) as r:
            assert (r.status, await r.json()) == (404, {"error": NOT_FOUND})
        async with http.get(f"{gateway.admin_url}/healthz") as response:
            assert response.status == 200

        # Unknown ids, both ways: one line, exit 1.
        for way in ((), ("--admin",)):
            unknown = inspect(path, "no-such-task", *way)
            assert await asyncio.to_thread(taskgate, *unknown) == 1
            out, err = capsys.readouterr()
            assert out == ""
            assert stderr_lines(err) == [
                "taskgate: no route for task no-such-task (unknown, or expired)"
            ]

        # Without the admin token here, the listener refuses; the command says what to set.
        monkeypatch.delenv(ADMIN_ENV)
        assert await asyncio.to_thread(taskgate, *inspect(path, task_id, "--admin")) == 1
        out, err = capsys.readouterr()
        assert stderr_lines(err) == [
            f"taskgate: the admin listener http://127.0.0.1:{admin_port} refused (401): "
            f"set ${ADMIN_ENV} here to the admin token"
        ]
        assert ADMIN_TOKEN not in out + err


async def test_an_in_memory_store_is_inspected_through_the_admin_listener(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], report_backends: list[BackendProcess]
) -> None:
    (admin_port,) = free_ports(1)
    config = gateway_config(
        {"reports": [b.url for b in report_backends]},
        [(["generate_report"], "reports")],
        admin={"host": "127.0.0.1", "port": admin_port},
    )
    path = write_config(tmp_path / "taskgate.yaml", config.model_dump(mode="json"))
    async with serving(load_config(path)) as gateway, aiohttp.ClientSession() as http:
        task_id = await create_task(http, gateway.url)
        # No --admin: an in-memory store is the process's own, the command asks it.
        assert await asyncio.to_thread(taskgate, *inspect(path, task_id)) == 0
    out = capsys.readouterr().out
    assert "tenant     - (anonymous)\n" in out
    assert "principal  - (anonymous)\n" in out
    assert out.endswith(f"source     admin listener http://127.0.0.1:{admin_port}\n")


def test_an_unreachable_store_is_one_line_naming_it_and_no_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (closed,) = free_ports(1)
    stores = {
        "missing.yaml": "sqlite:///./never-created.db",
        "redis.yaml": f"redis://:hunter2@127.0.0.1:{closed}/0",
    }
    for name, url in stores.items():
        path = write_config(
            tmp_path / name,
            {
                "store": {"url": url, "timeout_s": 0.5},
                "backends": {"reports": {"replicas": ["http://127.0.0.1:9/mcp"]}},
                "routes": [{"tools": ["echo"], "backend": "reports"}],
            },
        )
        assert taskgate("task", "inspect", "t1", "--config", str(path)) == 1
        out, err = capsys.readouterr()
        assert out == ""
        (line,) = err.splitlines()
        assert "hunter2" not in line
        if name == "missing.yaml":
            assert line.startswith(
                f"taskgate: no task-route database at {tmp_path.resolve()}/never-created.db"
            )
        else:
            assert line.startswith(
                f"taskgate: the task store redis://:***@127.0.0.1:{closed}/0 is unavailable: "
                "cannot connect"
            )
    assert not (tmp_path / "never-created.db").exists()  # inspecting created nothing


def test_an_in_memory_store_without_an_admin_listener_cannot_be_inspected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = gateway_config({"reports": ["http://127.0.0.1:9/mcp"]}, [(["echo"], "reports")])
    path = write_config(tmp_path / "taskgate.yaml", config.model_dump(mode="json"))

    assert taskgate("task", "inspect", "t1", "--config", str(path)) == 1

    assert capsys.readouterr().err == (
        "taskgate: this configuration has no admin listener (admin:), and its store is not "
        "readable from here (sqlite:///:memory: lives in the taskgate process only)\n"
    )


# --- the admin listener off loopback -----------------------------------------------------------


@asynccontextmanager
async def off_loopback_admin(config: Config) -> AsyncIterator[TestClient[Any, Any]]:
    async with gateway_state(config) as state:
        # TestServer binds 127.0.0.1: the guard judges the configured host, not the socket.
        client = TestClient(TestServer(make_admin_app(state), host="127.0.0.1"))
        await client.start_server()
        try:
            yield client
        finally:
            await client.close()


def admin_config(**admin: Any) -> Config:
    return gateway_config(
        {"reports": ["http://127.0.0.1:9/mcp"]},
        [(["echo"], "reports")],
        admin={"host": "0.0.0.0", "port": 9999, **admin},
    )


async def test_off_loopback_the_admin_paths_need_a_configured_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with off_loopback_admin(admin_config()) as client:
        for path in ("/tasks/t1", "/metrics", "/"):
            async with client.get(path) as response:
                assert response.status == 403, path
                assert "admin.bearer_env" in await response.text()
        async with client.get("/healthz") as response:
            assert response.status == 200
        async with client.get("/readyz") as response:
            assert response.status != 403  # the probes stay open to the orchestrator

    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    async with off_loopback_admin(admin_config(bearer_env=ADMIN_ENV)) as client:
        async with client.get("/tasks/t1", headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401
        async with client.get("/tasks/t1", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as r:
            assert (r.status, await r.json()) == (404, {"error": NOT_FOUND})
        async with client.get("/healthz") as response:
            assert response.status == 200


# --- the pieces -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (850, "850 ms"),
        (45_000, "45 s"),
        (90_000, "1 min 30 s"),
        ((3 * 3600 + 12 * 60 + 5) * 1000, "3 h 12 min"),
        (3 * 3600 * 1000 + 5000, "3 h"),
        (2 * 86_400 * 1000, "2 d"),
    ],
)
def test_a_span_reads_in_its_two_largest_units(ms: int, text: str) -> None:
    assert span(ms) == text


def test_the_admin_answer_carries_the_whole_route_and_not_the_id() -> None:
    route = TaskRoute("t-1", "reports", "http://r1/mcp", "acme", "alice", 1_000, None, 61_000)
    body = route_json(route)
    assert "t-1" not in json.dumps(body)
    assert body["created_at"] == "1970-01-01T00:00:01.000Z"
    assert route_from_json("t-1", json.loads(json.dumps(body))) == route
    with pytest.raises(ValueError, match="integers"):
        route_from_json("t-1", {**body, "ttl_ms": "soon"})
