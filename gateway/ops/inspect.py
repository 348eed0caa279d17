"""Inspection for the operator: `taskgate routes`, `taskgate task inspect`, GET /tasks/<id>.

`routes` prints the compiled route table, one row per item, and what never wins. `task inspect`
prints one task route (its owner replica and principal, its expiry) read from the store, or
from the running taskgate's admin listener when only that process can see the store (an
in-memory SQLite database) or when asked to. The task id itself is shown as the request log
shows it, hashed (gateway/observe/access.py), so the operator can grep the log for it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import UTC, datetime
from typing import Any, NamedTuple
from urllib.parse import quote

from aiohttp import web

from gateway.catalog.collisions import collisions
from gateway.catalog.table import RouteTable
from gateway.config import ROUTE_KINDS, AdminConfig, Config, sqlite_path
from gateway.errors import StoreUnavailable
from gateway.observe.access import task_hash
from gateway.ops.admin_client import admin_base, admin_headers
from gateway.pipeline.state import GATEWAY
from gateway.store.base import TaskRoute, now_ms
from gateway.store.redis_url import masked

ADMIN_TIMEOUT_S = 10.0
NOT_FOUND = "no route for this task (unknown, or expired)"
_COLUMNS = ("route", "kind", "pattern", "backend", "tenants", "scopes")


class CannotAsk(Exception):
    """The store or the admin listener could not be asked; the message names which and why."""


# --- taskgate routes ----------------------------------------------------------------------


def routes_command(config: Config, args: argparse.Namespace) -> int:
    """The route table, the items it shadows, and with --discover what the backends' lists add;
    exit 1 when a backend did not answer discovery, as `check --discover` does."""
    served: list[str] | None = None
    silent: list[str] = []
    eras: list[str] = []
    if args.discover:
        served, silent, eras = asyncio.run(discovered(config))
    if not _emit(routes_text(config, served, silent, eras)):
        return 0
    for name in silent:
        print(f"taskgate: warning: backend {name!r} did not answer discovery", file=sys.stderr)
    return 1 if silent else 0


def routes_text(
    config: Config,
    served: list[str] | None = None,
    silent: list[str] | None = None,
    eras: list[str] | None = None,
) -> str:
    """The compiled table in aligned columns (YAML order, which is precedence, then kind), then
    the configuration's shadowed and overlapping items and, given, the backends' findings
    (`silent`: the backends that did not answer, whose items they leave out; `eras`: what each
    replica speaks)."""
    rows: list[tuple[str, ...]] = [_COLUMNS]
    for route in RouteTable(config.routes).routes:
        tenants = "all" if route.tenants is None else ",".join(sorted(route.tenants)) or "none"
        scopes = ",".join(route.scopes) or "-"
        for kind in ROUTE_KINDS:
            for pattern in getattr(route, kind):
                rows.append((str(route.index), kind, pattern, route.backend, tenants, scopes))
    lines = _aligned(rows)
    lines += ["", "shadowed or overlapping, by the configuration:"]
    lines += [f"  {finding}" for finding in collisions(config.routes)] or ["  none"]
    if served is not None:
        lines.append("shadowed or served twice, by what the backends serve:")
        lines += [f"  {finding}" for finding in served] or ["  none"]
        lines += [
            f"  (backend {name!r} did not answer: its items are not here)" for name in silent or ()
        ]
    if eras:
        lines.append("what each replica speaks:")
        lines += [f"  {line}" for line in eras]
    return "\n".join(lines)


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


class Discovered(NamedTuple):
    """What one look at the backends found."""

    warnings: list[str]  # gateway/catalog/served.py's
    silent: list[str]  # the routed backends that did not answer
    eras: list[str]  # each replica's era: "backend  host:port  2026-07-28"


async def discovered(config: Config) -> Discovered:
    """One look at every routed backend, as a starting taskgate takes it (and at the era of
    every replica): the warnings of gateway/catalog/served.py, the backends that did not
    answer, and what each replica speaks."""
    from gateway.catalog.discovery import Catalog
    from gateway.errors import Retryable
    from gateway.pipeline.parts import relay_pool
    from gateway.upstream.replicas import Backend

    backends = {name: Backend.from_config(name, b) for name, b in config.backends.items()}
    table = RouteTable(config.routes)
    pool = relay_pool(config)  # the head limits and answer bounds a starting taskgate has
    catalog = Catalog(pool, backends, table, refresh_s=config.discovery.refresh_s, report=False)
    try:
        try:
            views = await catalog.views()
        except Retryable:
            views = {}
        await catalog.eras.learn_all()
        eras = _aligned(
            [
                (name, replica.label, catalog.eras.described(backend, replica))
                for name, backend in backends.items()
                for replica in backend.replicas
            ]
        )
    finally:
        await catalog.close()
        await pool.close()
    silent = [name for name in table.backends() if name not in views]
    return Discovered(catalog.warnings(), silent, eras)


# --- taskgate task inspect and GET /tasks/<id> ----------------------------------------------


def task_command(config: Config, args: argparse.Namespace) -> int:
    """Print one task route; read from the store, or from the admin listener with --admin and
    whenever the store is in this process's memory only."""
    task_id: str = args.task_id
    url = config.store.url
    in_memory = url.startswith("sqlite:") and sqlite_path(url) == ":memory:"
    try:
        if args.admin or in_memory:
            admin = _admin_of(config, in_memory)
            base = _admin_base(admin)
            source = f"admin listener {base}"
            route = asyncio.run(_from_admin(admin, base, task_id))
        else:
            source = f"store {masked(config.store.url)}"
            _database_exists(config)
            route = asyncio.run(_from_store(config, task_id))
    except CannotAsk as exc:
        print(f"taskgate: {exc}", file=sys.stderr)
        return 1
    if route is None:
        print(f"taskgate: no route for task {task_id} (unknown, or expired)", file=sys.stderr)
        return 1
    _emit(describe_route(route, config, now_ms(), source))
    return 0


def describe_route(route: TaskRoute, config: Config, now: int, source: str) -> str:
    """What `task inspect` prints: label, value, one per line."""
    backend = config.backends.get(route.backend)
    gone = "  (not in the configuration now)"
    left = now - route.expires_at_ms
    fields = [
        ("task", f"{task_hash(route.task_id)}  (as the request log shows it)"),
        ("backend", route.backend + ("" if backend is not None else gone)),
        (
            "replica",
            route.replica
            + ("" if backend is not None and route.replica in backend.replicas else gone),
        ),
        ("tenant", route.tenant or "- (anonymous)"),
        ("principal", route.principal or "- (anonymous)"),
        ("created", utc(route.created_at_ms)),
        (
            "expires",
            f"{utc(route.expires_at_ms)}  " + ("(expired)" if left >= 0 else f"(in {span(-left)})"),
        ),
        (
            "ttl",
            "unlimited (the route is kept for tasks.unlimited_ttl_cap_s)"
            if route.ttl_ms is None
            else f"{span(route.ttl_ms)} ({route.ttl_ms} ms)",
        ),
        ("source", source),
    ]
    return "\n".join(f"{label:<10} {value}" for label, value in fields)


async def task_route(request: web.Request) -> web.Response:
    """GET /tasks/{task_id} on the admin listener: the route from this process's store (not its
    cache: what any instance would find), 404 when there is none."""
    store = request.app[GATEWAY].tasks.store
    try:
        route = await store.lookup(request.match_info["task_id"])
    except StoreUnavailable as exc:
        return web.json_response(
            {"error": f"the task store is unavailable: {_said(exc)}"}, status=503
        )
    if route is None:
        return web.json_response({"error": NOT_FOUND}, status=404)
    return web.json_response(route_json(route))


def route_json(route: TaskRoute) -> dict[str, Any]:
    """A route as the admin listener answers it: times in milliseconds and as UTC text, the
    task id hashed as in the request log (the caller has the id; the answer need not repeat it)."""
    return {
        "task": task_hash(route.task_id),
        "backend": route.backend,
        "replica": route.replica,
        "tenant": route.tenant,
        "principal": route.principal,
        "created_at": utc(route.created_at_ms),
        "created_at_ms": route.created_at_ms,
        "expires_at": utc(route.expires_at_ms),
        "expires_at_ms": route.expires_at_ms,
        "ttl_ms": route.ttl_ms,
    }


def route_from_json(task_id: str, body: Any) -> TaskRoute:
    """The route `route_json` described; ValueError when the answer is not one."""
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    text = {key: body.get(key) for key in ("backend", "replica", "tenant", "principal")}
    times = {key: body.get(key) for key in ("created_at_ms", "expires_at_ms")}
    ttl = body.get("ttl_ms")
    if not all(isinstance(value, str) for value in text.values()):
        raise ValueError("backend, replica, tenant and principal must be strings")
    if not all(_is_int(value) for value in times.values()) or not (ttl is None or _is_int(ttl)):
        raise ValueError("created_at_ms, expires_at_ms and ttl_ms must be integers")
    return TaskRoute(
        task_id=task_id,
        backend=body["backend"],
        replica=body["replica"],
        tenant=body["tenant"],
        principal=body["principal"],
        created_at_ms=body["created_at_ms"],
        ttl_ms=ttl,
        expires_at_ms=body["expires_at_ms"],
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _database_exists(config: Config) -> None:
    """Opening a SQLite file that is not there would create an empty database: say instead
    that none is there."""
    url = config.store.url
    if url.startswith("sqlite:") and not os.path.isfile(sqlite_path(url)):
        raise CannotAsk(
            f"no task-route database at {sqlite_path(url)}: has taskgate run with this "
            "configuration on this machine?"
        )


async def _from_store(config: Config, task_id: str) -> TaskRoute | None:
    from gateway.errors import StartupError
    from gateway.tasks.stores import open_store

    url = config.store.url
    try:
        store = await open_store(config.store)
    except StoreUnavailable as unopened:  # its message names the store, password masked
        raise CannotAsk(_said(unopened)) from None
    except StartupError as refused:
        raise CannotAsk(f"cannot open the task-route store {masked(url)}: {refused}") from None
    try:
        return await store.lookup(task_id)
    except StoreUnavailable as unread:
        raise CannotAsk(_said(unread)) from None
    finally:
        await store.close()


async def _from_admin(admin: AdminConfig, base: str, task_id: str) -> TaskRoute | None:
    import aiohttp
    from yarl import URL

    headers = admin_headers(admin)
    url = URL(f"{base}/tasks/{quote(task_id, safe='')}", encoded=True)
    timeout = aiohttp.ClientTimeout(total=ADMIN_TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout, cookie_jar=aiohttp.DummyCookieJar()) as http,
            http.get(url, headers=headers) as response,
        ):
            status = response.status
            is_json = response.content_type == "application/json"
            body: Any = await response.json() if is_json else await response.text()
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise CannotAsk(
            f"the admin listener {base} did not answer: {exc or type(exc).__name__}"
        ) from None
    if status == 200 and is_json:
        try:
            return route_from_json(task_id, body)
        except ValueError as bad:
            raise CannotAsk(f"the admin listener {base} answered no task route: {bad}") from None
    if status == 404 and is_json:
        return None
    if status in (401, 403):
        why = _refusal(admin, "Authorization" in headers)
        raise CannotAsk(f"the admin listener {base} refused ({status}): {why}")
    if status == 404:
        raise CannotAsk(f"the admin listener {base} serves no /tasks/ (an older taskgate?)")
    said = body.get("error") if isinstance(body, dict) else str(body).strip()
    raise CannotAsk(f"the admin listener {base} answered {status}: {said}")


def _said(exc: Exception) -> str:
    """An error's message without the advice meant for MCP clients."""
    return str(exc).removesuffix("; retry")


def _admin_of(config: Config, in_memory: bool) -> AdminConfig:
    if config.admin is not None:
        return config.admin
    if in_memory:
        raise CannotAsk(
            "this configuration has no admin listener (admin:), and its store is not readable "
            "from here (sqlite:///:memory: lives in the taskgate process only)"
        )
    raise CannotAsk("this configuration has no admin listener (admin:)")


def _admin_base(admin: AdminConfig) -> str:
    """The admin listener's URL as reached from this machine."""
    base = admin_base(admin)
    if base is None:
        raise CannotAsk(
            "admin.port is 0 (a free port chosen at start): this command cannot know it; "
            "configure a fixed port"
        )
    return base


def _refusal(admin: AdminConfig, sent_token: bool) -> str:
    if admin.bearer_env is None:
        return (
            "off loopback its operator paths need a token: set admin.bearer_env, and that "
            "variable, in both places"
        )
    if not sent_token:
        return f"set ${admin.bearer_env} here to the admin token"
    return f"the token in ${admin.bearer_env} is not the one the listener expects"


# --- shared -------------------------------------------------------------------------------


def utc(ms: int) -> str:
    """Milliseconds since the epoch as UTC ISO 8601 text, as the JSON request log writes time."""
    when = datetime.fromtimestamp(ms / 1000, UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def span(ms: int) -> str:
    """A duration in its two largest units: "3 h 12 min", "2 d", "45 s", "850 ms"."""
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms // 1000
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    units = [(days, "d"), (hours, "h"), (minutes, "min"), (seconds, "s")]
    first = next(i for i, (value, _) in enumerate(units) if value)
    shown = [units[first]] + [u for u in units[first + 1 : first + 2] if u[0]]
    return " ".join(f"{value} {unit}" for value, unit in shown)


def _emit(text: str) -> bool:
    """Print `text`; False when the reader has gone (`taskgate routes | head`), quietly."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail
        os.close(devnull)
        return False
    return True
