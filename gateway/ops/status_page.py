"""The admin listener's status page (GET /): what this process serves and how it is doing, as
server-rendered HTML without JavaScript.

`gather` reads the process state into a `Status` (plain data); `render` turns it into HTML.
Every value that comes from the configuration or from traffic (backend names, route patterns,
tenants, error messages) is escaped by the one cell builder, so a tenant claim or a tool name
holding markup is shown as text. Replicas appear by host:port only: a replica URL's path may
carry a secret. Task ids appear only hashed, as the request log has them.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.catalog.table import Route
from gateway.config import ROUTE_KINDS
from gateway.observe.history import Reload
from gateway.observe.observer import Failure
from gateway.ops.inspect import span, utc
from gateway.ops.readiness import readiness
from gateway.ops.status_limits import LimitsStatus, limits_status
from gateway.pipeline.state import GATEWAY, Gateway

REFRESH_S = 10
# No script may run here even if escaping were ever missed; inline style is the page's only asset.
_CSP = "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'"


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    label: str  # host:port, never the URL
    healthy: bool
    ejections: int
    era: str  # what it speaks (gateway/bridge/eras.py, described)
    sessions: int = 0  # callers' 2025-era sessions open on it (gateway/bridge/callers.py)


@dataclass(frozen=True, slots=True)
class BackendStatus:
    name: str
    in_flight: int
    replicas: tuple[ReplicaStatus, ...]


@dataclass(frozen=True, slots=True)
class Status:
    now: float
    ready: bool
    why_not: tuple[str, ...]  # empty when ready
    workers: tuple[dict[str, Any], ...]  # each worker's readiness, with --workers; else empty
    version: str
    config_path: str | None
    started_at: float
    loaded_at: float
    in_flight: int
    draining: bool
    listen_streams: int
    pollers: int
    backends: tuple[BackendStatus, ...]
    routes: tuple[Route, ...]
    cached_task_routes: int
    outcomes: dict[str, int]
    by_method: dict[str, tuple[int, int]]  # method -> (requests, failed)
    by_status: dict[str, int]  # "2xx" -> requests
    by_code: dict[str, int]  # JSON-RPC code class ("ok", "invalid_params"...) -> requests
    failures: tuple[Failure, ...]  # newest first
    auth_refusals: int  # 401s and pre-auth 403s since start, not among `failures`
    reloads: tuple[Reload, ...]  # newest first
    limits: LimitsStatus  # who is near a limit, who met one lately


async def gather(gateway: Gateway) -> Status:
    """This process's state as the page shows it, read at one moment."""
    ready = await readiness(gateway)
    why = why_not_ready(ready)
    workers: list[dict[str, Any]] = []
    board = gateway.board
    if board is not None:  # the instance is ready when every worker is, as /readyz says
        workers = board.workers(ready)
        for worker in workers:
            if not worker["ready"] and worker["worker"] != board.index:
                why.append(f"worker {worker['worker']}: " + "; ".join(why_not_ready(worker)))
    backends = _backend_statuses(gateway)
    by_method: dict[str, tuple[int, int]] = {}
    by_status: dict[str, int] = {}
    by_code: dict[str, int] = {}
    for (method, status, code, _), count in gateway.observer.metrics.requests.items():
        failed = count if status >= 400 or code != "ok" else 0
        seen, seen_failed = by_method.get(method, (0, 0))
        by_method[method] = (seen + count, seen_failed + failed)
        status_class = f"{status // 100}xx"
        by_status[status_class] = by_status.get(status_class, 0) + count
        by_code[code] = by_code.get(code, 0) + count
    history = gateway.history
    return Status(
        now=time.time(),
        ready=not why,
        why_not=tuple(why),
        workers=tuple(workers),
        version=history.version,
        config_path=history.path,
        started_at=history.started_at,
        loaded_at=history.loaded_at,
        in_flight=gateway.coordinator.in_flight,
        draining=gateway.coordinator.draining,
        listen_streams=gateway.listens.streams,
        pollers=gateway.listens.pollers,
        backends=backends,
        routes=gateway.routes.routes,
        cached_task_routes=len(gateway.tasks.cache),
        outcomes=dict(gateway.tasks.outcomes),
        by_method=dict(sorted(by_method.items())),
        by_status=dict(sorted(by_status.items())),
        by_code=dict(sorted(by_code.items())),
        failures=tuple(reversed(gateway.observer.failures)),
        auth_refusals=gateway.observer.auth_refusals,
        reloads=tuple(reversed(gateway.history.reloads)),
        limits=limits_status(gateway),
    )


def _backend_statuses(gateway: Gateway) -> tuple[BackendStatus, ...]:
    """Each backend's calls in flight, and each replica's health and era."""
    health, per_backend = gateway.health, gateway.coordinator.per_backend()
    eras = gateway.catalog.eras
    return tuple(
        BackendStatus(
            name,
            per_backend.get(name, 0),
            tuple(
                ReplicaStatus(
                    r.label,
                    health.healthy(r),
                    health.ejections.get((name, r.label), 0),
                    eras.described(backend, r),
                    gateway.callers.count(r),
                )
                for r in backend.replicas
            ),
        )
        for name, backend in gateway.backends.items()
    )


def why_not_ready(body: dict[str, Any]) -> list[str]:
    """What keeps a /readyz body (or one worker's entry) from ready, in words."""
    why = []
    if "problem" in body:  # a worker that has not published, or has gone silent
        why.append(str(body["problem"]))
    store = body.get("store", "ok")
    if store != "ok":
        why.append(f"store {store}")
    for name, backend in body.get("backends", {}).items():
        if not backend.get("healthy"):
            why.append(f"backend {name}: none of its {backend.get('replicas')} replicas is healthy")
    if body.get("draining"):
        why.append("draining")
    return why


async def status_page(request: web.Request) -> web.Response:
    status = await gather(request.app[GATEWAY])
    return web.Response(
        text=render(status),
        content_type="text/html",
        charset="utf-8",
        headers={
            "Cache-Control": "no-store",
            "Content-Security-Policy": _CSP,
            "X-Content-Type-Options": "nosniff",
        },
    )


# --- rendering ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cell:
    text: str
    css: str = ""  # one of the page's own classes, never data
    rowspan: int = 1


def _cell(value: str | int | Cell, tag: str = "td") -> str:
    cell = value if isinstance(value, Cell) else Cell(str(value))
    attrs = f' class="{cell.css}"' if cell.css else ""
    attrs += f' rowspan="{cell.rowspan}"' if cell.rowspan > 1 else ""
    return f"<{tag}{attrs}>{html.escape(cell.text)}</{tag}>"


def _table(head: Sequence[str], rows: Iterable[Sequence[str | int | Cell]]) -> str:
    """The only way data reaches the page: every cell is escaped here."""
    header = "".join(_cell(name, "th") for name in head)
    thead = f"<thead><tr>{header}</tr></thead>" if head else ""
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>\n" for row in rows)
    return f"<table>{thead}<tbody>\n{body}</tbody></table>"


def _section(anchor: str, title: str, *parts: str) -> str:
    return f'<section id="{anchor}"><h2>{title}</h2>\n' + "\n".join(parts) + "</section>\n"


def _none(text: str) -> str:
    return f'<p class="none">{html.escape(text)}</p>'


def _when(at: float) -> str:
    return utc(int(at * 1000))


def _summary(s: Status) -> str:
    rows: list[tuple[str, str | int | Cell]] = [
        ("ready", Cell("ready", "ok") if s.ready else Cell("not ready", "bad")),
        *(("not ready because", why) for why in s.why_not),
        ("configuration version", s.version),
        ("configuration file", s.config_path or "(built in code)"),
        ("loaded", _when(s.loaded_at)),
        ("up since", f"{_when(s.started_at)} ({span(int((s.now - s.started_at) * 1000))})"),
        ("requests in flight", s.in_flight),
        ("draining", Cell("yes", "bad") if s.draining else "no"),
        ("listen streams", s.listen_streams),
        ("tasks polled for listens", s.pollers),
    ]
    parts = [_table((), rows)]
    if s.workers:
        parts.append(
            _table(
                ("worker", "pid", "state", "in flight", "why not ready"),
                (
                    (
                        str(w.get("worker")),
                        str(w.get("pid") or "-"),
                        Cell("ready", "ok") if w.get("ready") else Cell("not ready", "bad"),
                        str(w.get("in_flight", "-")),
                        "; ".join(why_not_ready(w)) or "-",
                    )
                    for w in s.workers
                ),
            )
        )
    return _section("summary", "Summary", *parts)


def _backends(s: Status) -> str:
    rows: list[list[str | int | Cell]] = []
    for backend in s.backends:
        for i, replica in enumerate(backend.replicas):
            row: list[str | int | Cell] = []
            if i == 0:
                row.append(Cell(backend.name, rowspan=len(backend.replicas)))
            health = Cell("healthy", "ok") if replica.healthy else Cell("ejected", "bad")
            row += [replica.label, replica.era, replica.sessions, health, replica.ejections]
            if i == 0:
                row.append(Cell(str(backend.in_flight), rowspan=len(backend.replicas)))
            rows.append(row)
    head = ("backend", "replica", "speaks", "sessions", "health", "ejections", "in flight")
    return _section("backends", "Backends", _table(head, rows) if rows else _none("no backend"))


def _route_row(route: Route) -> list[str | int | Cell]:
    patterns = [", ".join(getattr(route, kind)) or "-" for kind in ROUTE_KINDS]
    tenants = "all" if route.tenants is None else ", ".join(sorted(route.tenants))
    return [route.index, route.backend, *patterns, tenants, ", ".join(route.scopes) or "-"]


def _routes(s: Status) -> str:
    counts = (
        (
            kind,
            sum(len(getattr(r, kind)) for r in s.routes),
            sum(1 for r in s.routes if getattr(r, kind)),
        )
        for kind in ROUTE_KINDS
    )
    return _section(
        "routes",
        f"Routes ({len(s.routes)})",
        _table(("kind", "patterns", "routes"), counts),
        _table(("#", "backend", *ROUTE_KINDS, "tenants", "scopes"), map(_route_row, s.routes)),
    )


def _tasks(s: Status) -> str:
    rows = [("task routes in memory", s.cached_task_routes), *s.outcomes.items()]
    return _section("tasks", "Task routes", _table((), rows))


def _requests(s: Status) -> str:
    if not s.by_method:
        return _section("requests", "Requests", _none("no request yet"))
    methods = ((m, total, failed) for m, (total, failed) in s.by_method.items())
    return _section(
        "requests",
        f"Requests ({sum(s.by_status.values())})",
        _table(("method", "requests", "failed"), methods),
        _table(("HTTP status", "requests"), s.by_status.items()),
        _table(("JSON-RPC outcome", "requests"), s.by_code.items()),
    )


def _limits(s: Status) -> str:
    near, refused = s.limits.near, s.limits.refused
    return _section(
        "limits",
        "Limits",
        _table(("tenant near its in-flight limit", "in flight", "limit"), near)
        if near
        else _none("no tenant holds 80% of its requests in flight"),
        _table(
            ("tenant refused lately", "limit", "at (UTC)"),
            ((t, n, _when(a)) for t, n, a in refused),
        )
        if refused
        else _none("no request refused by a limit"),
    )


def _errors(s: Status) -> str:
    head = ("at (UTC)", "method", "status", "code", "backend", "replica", "tenant", "task")
    rows = (
        (
            _when(f.at),
            f.method,
            f.status,
            "-" if f.code is None else f.code,
            f.backend or "-",
            f.replica or "-",
            f.tenant or "-",
            f.task or "-",
            f.message or "-",
        )
        for f in s.failures
    )
    table = _table((*head, "message"), rows) if s.failures else _none("no failed request yet")
    # Anyone can send requests without a token: listed, they would push the real failures out.
    refusals = (
        f"<p>authentication refusals: {s.auth_refusals} since start "
        "(401, and 403 for a disallowed Origin; counted, not listed)</p>"
    )
    return _section("errors", "Recent errors (newest first)", refusals, table)


def _reloads(s: Status) -> str:
    rows = (
        (
            _when(r.at),
            r.trigger,
            r.version,
            Cell("applied", "ok") if r.applied else Cell("refused", "bad"),
            "; ".join(r.changes if r.applied else r.problems) or "-",
        )
        for r in s.reloads
    )
    head = ("at (UTC)", "trigger", "version", "outcome", "changes or problems")
    table = _table(head, rows) if s.reloads else _none("no reload yet")
    return _section("reloads", "Reloads (newest first)", table)


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse;margin:.3em 0}
th,td{border:1px solid #ccc;padding:.2em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}.ok{color:#070}.bad{color:#b00;font-weight:bold}.none{color:#666}
"""


def render(s: Status) -> str:
    """The whole page; no script, one inline style."""
    state = "ready" if s.ready else "NOT READY"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        f"<title>taskgate: {state}</title><style>{_STYLE}</style></head>\n<body>\n"
        f"<h1>taskgate status</h1><p>as of {_when(s.now)}</p>\n"
        + _summary(s)
        + _backends(s)
        + _routes(s)
        + _tasks(s)
        + _requests(s)
        + _limits(s)
        + _errors(s)
        + _reloads(s)
        + "</body></html>\n"
    )
