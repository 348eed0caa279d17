"""The status page on the admin listener, as a real browser shows it after real traffic.

taskgate runs in-process in front of the two report replicas, with JWT auth from a real issuer
so that tenants are real; headless Chromium (Debian's `chromium`, which `make test` installs)
loads the page and its DOM is read back. The page carries no script, so what Chromium dumps is
what an operator reads.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from gateway.config import Config
from gateway.observe.history import Reload
from gateway.ops.status_limits import LimitsStatus
from gateway.ops.status_page import Status, render
from tests.gateway.test_observability import scrape, value
from tests.support.gateway import serving
from tests.support.issuer import Issuer, jwt_auth, running_issuer
from tests.support.mcp import build_request, post_raw
from tests.support.procs import BackendProcess

CHROMIUM_TIMEOUT_S = 30.0
ids = itertools.count(80_000)


@pytest.fixture
async def issuer() -> Any:
    async with running_issuer("ES256") as running:
        yield running


def config(issuer: Issuer, backends: list[BackendProcess], **sections: Any) -> Config:
    return Config.model_validate(
        {
            "listen": {"host": "127.0.0.1", "port": 0},
            "store": {"url": "sqlite:///:memory:"},
            "auth": jwt_auth(issuer),
            "admin": {"host": "127.0.0.1", "port": 0},
            "backends": {"reports": {"replicas": [b.url for b in backends]}},
            "routes": [
                {"tools": ["generate_report", "echo"], "backend": "reports"},
                {"prompts": ["summarize"], "backend": "reports", "tenants": ["acme"]},
            ],
            **sections,
        }
    )


async def call(
    http: aiohttp.ClientSession, url: str, token: str, method: str, params: dict[str, Any]
) -> Any:
    body = build_request(method, params, id=next(ids))
    return await post_raw(http, url, body, headers={"Authorization": f"Bearer {token}"})


# --- the browser and what it shows ----------------------------------------------------------


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail(
            "these tests load the status page in headless Chromium, which is not installed: "
            "`make test` installs Debian's chromium package (or: apt-get install chromium)"
        )
    return found


async def dump_dom(url: str, profile: Path) -> str:
    """The DOM of `url` once Chromium has loaded it, serialised."""
    browser = await asyncio.create_subprocess_exec(
        chromium(),
        "--headless",
        "--no-sandbox",  # the tests may run as root
        "--disable-gpu",
        f"--user-data-dir={profile}",  # a profile of its own: runs never share a lock
        "--dump-dom",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(CHROMIUM_TIMEOUT_S):
            out, err = await browser.communicate()
    except TimeoutError:
        browser.kill()
        await browser.wait()
        raise AssertionError(f"chromium did not dump {url} within {CHROMIUM_TIMEOUT_S} s") from None
    assert browser.returncode == 0, err.decode(errors="replace")[-2000:]
    assert out.strip(), f"chromium dumped nothing for {url}: {err.decode(errors='replace')[-2000:]}"
    return out.decode()


class Page(HTMLParser):
    """The elements of a page, and per section (by id) its text and its tables, each a list of
    rows of cell texts (a header row first, when the table has one)."""

    def __init__(self, document: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: dict[str, str] = {}
        self.tables: dict[str, list[list[list[str]]]] = {}
        self._section: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self.feed(document)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "section":
            self._section = dict(attrs).get("id") or "?"
            self.text[self._section] = ""
            self.tables[self._section] = []
        elif tag == "table" and self._section is not None:
            self.tables[self._section].append([])
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self._section = None
        elif tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None and self._section is not None:
            self.tables[self._section][-1].append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._section is not None:
            self.text[self._section] += data
        if self._cell is not None:
            self._cell.append(data)

    def table(self, section: str, head: str | None = None) -> list[list[str]]:
        """The rows of the table in `section` whose header starts with `head` (without its
        header), or of its first table."""
        tables = self.tables[section]
        if head is None:
            return tables[0]
        for table in tables:
            if table and table[0][0] == head:
                return table[1:]
        raise AssertionError(f"no table {head!r} in #{section}: {tables!r}")

    def by_first(self, section: str, head: str | None = None) -> dict[str, list[str]]:
        return {row[0]: row[1:] for row in self.table(section, head)}

    def row_with(self, section: str, head: str, cell: str) -> list[str]:
        """The row of a table holding a cell `cell` (a table with a rowspan lists the spanning
        cells in its first row only)."""
        for row in self.table(section, head):
            if cell in row:
                return row
        raise AssertionError(f"no row with {cell!r} in #{section}: {self.tables[section]!r}")


def label(backend: BackendProcess) -> str:
    return urlsplit(backend.url).netloc


# --- the tests ------------------------------------------------------------------------------


async def test_the_page_answers_html_that_no_cache_keeps(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    async with serving(config(issuer, report_backends)) as gateway:
        assert gateway.admin_url is not None
        async with http.get(f"{gateway.admin_url}/") as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/html; charset=utf-8"
            assert response.headers["Cache-Control"] == "no-store"
            assert "script-src" not in response.headers["Content-Security-Policy"]
            assert response.headers["Content-Security-Policy"].startswith("default-src 'none'")
            text = await response.text()
    page = Page(text)
    assert "script" not in page.tags
    sections = ["summary", "backends", "routes", "tasks", "requests", "limits", "errors", "reloads"]
    assert list(page.text) == sections
    assert "no failed request yet" in page.text["errors"]
    assert "no reload yet" in page.text["reloads"]
    assert "no request yet" in page.text["requests"]


async def test_chromium_shows_backends_counts_errors_and_version_after_real_traffic(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    tmp_path: Path,
) -> None:
    token = issuer.token(tenant="acme", subject="alice")
    made_up = "made-up-task-5d0c2e"
    async with serving(config(issuer, report_backends)) as gateway:
        for _ in range(3):
            echoed = await call(
                http, gateway.url, token, "tools/call", {"name": "echo", "arguments": {"text": "x"}}
            )
            assert echoed.status == 200
            assert "result" in echoed.message
        created = await call(
            http,
            gateway.url,
            token,
            "tools/call",
            {"name": "generate_report", "arguments": {"size": "small"}},
        )
        task_id = created.message["result"]["taskId"]
        polled = await call(http, gateway.url, token, "tasks/get", {"taskId": task_id})
        assert "result" in polled.message
        unknown = await call(http, gateway.url, token, "tools/call", {"name": "no_such_tool"})
        assert unknown.message["error"]["code"] == -32602
        lost = await call(http, gateway.url, token, "tasks/get", {"taskId": made_up})
        assert lost.message["error"]["code"] == -32602

        dom = await dump_dom(f"{gateway.admin_url}/", tmp_path / "profile")
        version = gateway.state.history.version

    page = Page(dom)
    assert "script" not in page.tags
    summary = page.by_first("summary")
    assert summary["ready"] == ["ready"]
    assert "not ready because" not in summary
    assert summary["configuration version"] == [version]
    assert summary["requests in flight"] == ["0"]
    assert summary["draining"] == ["no"]

    first, second = (label(b) for b in report_backends)
    assert page.table("backends", "backend") == [
        ["reports", first, "2026-07-28", "0", "healthy", "0", "0"],
        [second, "2026-07-28", "0", "healthy", "0"],
    ]
    for backend in report_backends:  # labels only: a replica URL's path may carry a secret
        assert backend.url not in dom

    kinds = page.by_first("routes", "kind")
    assert kinds["tools"] == ["2", "1"]
    assert kinds["prompts"] == ["1", "1"]
    assert page.table("routes", "#") == [
        ["0", "reports", "generate_report, echo", "-", "-", "-", "all", "-"],
        ["1", "reports", "-", "summarize", "-", "-", "acme", "-"],
    ]

    tasks = page.by_first("tasks")
    assert tasks["task routes in memory"] == ["1"]
    assert tasks["recorded"] == tasks["found"] == tasks["not_found"] == ["1"]
    assert tasks["conflict"] == tasks["store_down"] == ["0"]

    methods = page.by_first("requests", "method")
    assert methods["tools/call"] == ["5", "1"]  # 3 echo, 1 task created, 1 unknown tool
    assert methods["tasks/get"] == ["2", "1"]  # the real task, then the made-up id
    assert page.by_first("requests", "HTTP status") == {"2xx": ["7"]}
    assert page.by_first("requests", "JSON-RPC outcome") == {"invalid_params": ["2"], "ok": ["5"]}

    head = ["at (UTC)", "method", "status", "code", "backend", "replica", "tenant", "task"]
    assert page.tables["errors"][0][0] == [*head, "message"]
    newest, older = page.table("errors", "at (UTC)")
    assert newest[1:4] == ["tasks/get", "200", "-32602"]
    assert newest[6] == "acme"
    assert newest[8] == "Task not found"
    assert older[1:4] == ["tools/call", "200", "-32602"]
    assert older[6] == "acme"
    assert older[8] == "Unknown tool: no_such_tool"
    assert older[0] <= newest[0]
    assert newest[0].endswith("Z")

    assert "no reload yet" in page.text["reloads"]
    # What the page never shows: a task id (only its hash), a token.
    assert task_id not in dom
    assert made_up not in dom
    assert token not in dom
    assert token.split(".")[2] not in dom


async def test_markup_from_a_tenant_or_a_tool_name_is_shown_as_text(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    tmp_path: Path,
) -> None:
    tenant = '<script>document.title="owned"</script>'
    tool = "<b>x</b>"
    token = issuer.token(tenant=tenant, subject="mallory")
    async with serving(config(issuer, report_backends)) as gateway:
        refused = await call(http, gateway.url, token, "tools/call", {"name": tool})
        assert refused.message["error"]["code"] == -32602
        dom = await dump_dom(f"{gateway.admin_url}/", tmp_path / "profile")

    page = Page(dom)
    assert "script" not in page.tags
    assert "b" not in page.tags
    (failure,) = page.table("errors", "at (UTC)")
    assert failure[6] == tenant
    assert failure[8] == f"Unknown tool: {tool}"
    assert "&lt;b&gt;x&lt;/b&gt;" in dom
    assert "<title>taskgate: ready</title>" in dom


async def test_an_ejected_replica_and_a_refused_reload_show(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    tmp_path: Path,
) -> None:
    async with serving(config(issuer, report_backends)) as gateway:
        state = gateway.state
        await state.prober.stop()  # only the failures reported below count
        ejected = state.backends["reports"].replicas[1]
        for _ in range(state.config.health.unhealthy_after):
            state.health.failure(ejected)
        state.history.record(
            Reload(
                at=time.time(),
                version="0123456789ab",
                applied=False,
                problems=("listen.port: 8080 -> <8081>: needs a restart",),
                changes=(),
                trigger="admin",
            )
        )
        dom = await dump_dom(f"{gateway.admin_url}/", tmp_path / "profile")

        for replica in state.backends["reports"].replicas:  # now none is healthy
            for _ in range(state.config.health.unhealthy_after):
                state.health.failure(replica)
        down = await dump_dom(f"{gateway.admin_url}/", tmp_path / "profile")

    page = Page(dom)
    assert page.table("backends", "backend") == [
        ["reports", label(report_backends[0]), "2026-07-28", "0", "healthy", "0", "0"],
        [ejected.label, "not known yet (era: auto)", "0", "ejected", "1"],  # stopped before asked
    ]
    assert page.by_first("summary")["ready"] == ["ready"]  # one healthy replica is enough
    (refused,) = page.table("reloads", "at (UTC)")
    assert refused[1:4] == ["admin", "0123456789ab", "refused"]
    assert refused[4] == "listen.port: 8080 -> <8081>: needs a restart"

    summary = Page(down).by_first("summary")
    assert summary["ready"] == ["not ready"]
    assert summary["not ready because"] == ["backend reports: none of its 2 replicas is healthy"]
    assert "<title>taskgate: NOT READY</title>" in down


async def test_requests_without_a_token_are_counted_apart_and_leave_real_failures_listed(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    token = issuer.token(tenant="acme", subject="alice")
    async with serving(config(issuer, report_backends)) as gateway:
        assert gateway.admin_url is not None
        listed = gateway.state.config.logging.recent_errors
        # More than the page lists: without a token, and with a foreign Origin (403 first).
        for _ in range(listed + 10):
            anonymous = await post_raw(http, gateway.url, build_request("tools/list", {}, id=1))
            assert anonymous.status == 401
        for _ in range(5):
            foreign = await post_raw(
                http,
                gateway.url,
                build_request("tools/list", {}, id=2),
                headers={"Origin": "https://evil.example"},
            )
            assert foreign.status == 403
        # Real failures, of a caller with a token: a 403 after authentication is one of them.
        rebound = await post_raw(
            http,
            gateway.url,
            build_request("tools/list", {}, id=3),
            headers={"Authorization": f"Bearer {token}", "Host": "evil.example"},
        )
        assert rebound.status == 403
        unknown = await call(http, gateway.url, token, "tools/call", {"name": "no_such_tool"})
        assert unknown.message["error"]["code"] == -32602
        async with http.get(f"{gateway.admin_url}/") as response:
            assert response.status == 200
            page = Page(await response.text())
        _, samples = await scrape(http, gateway.admin_url)

    newest, older = page.table("errors", "at (UTC)")
    assert newest[1:4] == ["tools/call", "200", "-32602"]
    assert newest[6:] == ["acme", "-", "Unknown tool: no_such_tool"]
    assert older[1:3] == ["-", "403"]
    assert older[6:] == ["acme", "-", "Forbidden: this Host name is not served here"]
    errors = " ".join(page.text["errors"].split())
    assert f"authentication refusals: {listed + 15} since start" in errors
    # /metrics still counts every one of them, by status.
    requests = "taskgate_requests_total"
    refused = {"method": "-", "rpc_code": "invalid_request", "backend": ""}
    assert value(samples, requests, status="401", **refused) == listed + 10
    assert value(samples, requests, status="403", **refused) == 5 + 1


def test_with_workers_the_summary_lists_each_one_and_why_it_is_not_ready() -> None:
    now = time.time()
    status = Status(
        now=now,
        ready=False,
        why_not=("worker 1: not published yet",),
        workers=(
            {"worker": 0, "pid": 4242, "ready": True, "in_flight": 2, "store": "ok"},
            {"worker": 1, "ready": False, "problem": "not published yet"},
        ),
        version="abcdefabcdef",
        config_path="/etc/taskgate.yaml",
        started_at=now - 3725,
        loaded_at=now - 3725,
        in_flight=2,
        draining=False,
        listen_streams=0,
        pollers=0,
        backends=(),
        routes=(),
        cached_task_routes=0,
        outcomes={},
        by_method={},
        by_status={},
        by_code={},
        failures=(),
        auth_refusals=0,
        reloads=(),
        limits=LimitsStatus((), ()),
    )
    page = Page(render(status))
    summary = page.by_first("summary")
    assert summary["not ready because"] == ["worker 1: not published yet"]
    assert summary["up since"][0].endswith("(1 h 2 min)")
    assert page.table("summary", "worker") == [
        ["0", "4242", "ready", "2", "-"],
        ["1", "-", "not ready", "-", "not published yet"],
    ]
    assert "no backend" in page.text["backends"]
