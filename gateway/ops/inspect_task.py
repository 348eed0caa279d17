"""`taskgate task inspect` and GET /tasks/<id> on the admin listener.

`task inspect` prints one task route (its owner replica and principal, its expiry), or one task
taskgate runs (its status, holder and lease: gateway/ops/inspect_made.py), read from the store,
or from the running taskgate's admin listener when only that process can see the store (an
in-memory SQLite database) or when asked to. The task id itself is shown as the request log
shows it, hashed (gateway/observe/access.py), so the operator can grep the log for it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any
from urllib.parse import quote

from aiohttp import web

from gateway.config import AdminConfig, Config, sqlite_path
from gateway.errors import StoreUnavailable
from gateway.observe.access import task_hash
from gateway.ops.admin_client import admin_base, admin_headers
from gateway.ops.inspect import emit, span, utc
from gateway.ops.inspect_made import Inspected, describe_made, made_from_json, made_json
from gateway.pipeline.state import GATEWAY
from gateway.protocol.tasks import is_made
from gateway.store.base import TaskRoute, now_ms
from gateway.store.redis_url import masked

ADMIN_TIMEOUT_S = 10.0
NOT_FOUND = "no route for this task (unknown, or expired)"


class CannotAsk(Exception):
    """The store or the admin listener could not be asked; the message names which and why."""


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
            route: TaskRoute | Inspected | None = asyncio.run(_from_admin(admin, base, task_id))
        else:
            source = f"store {masked(config.store.url)}"
            _database_exists(config)
            route = asyncio.run(_from_store(config, task_id))
    except CannotAsk as exc:
        print(f"taskgate: {exc}", file=sys.stderr)
        return 1
    if route is None:
        what = "task taskgate runs" if is_made(task_id) else "route for task"
        print(f"taskgate: no {what} {task_id} (unknown, or expired)", file=sys.stderr)
        return 1
    if isinstance(route, Inspected):
        emit(describe_made(route, config, now_ms(), source))
    else:
        emit(describe_route(route, config, now_ms(), source))
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
    gateway = request.app[GATEWAY]
    store = gateway.tasks.store
    task_id = request.match_info["task_id"]
    try:
        if is_made(task_id):
            made = await gateway.made.store.lookup(task_id)
            if made is not None:
                return web.json_response(made_json(made))
            return web.json_response({"error": NOT_FOUND}, status=404)
        route = await store.lookup(task_id)
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


async def _from_store(config: Config, task_id: str) -> TaskRoute | Inspected | None:
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
        if is_made(task_id):
            made = await store.made().lookup(task_id)
            return Inspected(made, len(made.outcome)) if made is not None else None
        return await store.lookup(task_id)
    except StoreUnavailable as unread:
        raise CannotAsk(_said(unread)) from None
    finally:
        await store.close()


async def _from_admin(admin: AdminConfig, base: str, task_id: str) -> TaskRoute | Inspected | None:
    body = await admin_json(admin, base, task_id)
    if body is None:
        return None
    try:
        if is_made(task_id):
            return made_from_json(task_id, body)
        return route_from_json(task_id, body)
    except ValueError as bad:
        raise CannotAsk(f"the admin listener {base} answered no task route: {bad}") from None


async def admin_json(admin: AdminConfig, base: str, task_id: str) -> Any:
    """GET /tasks/<id> of the admin listener: its JSON, None for "no such task"."""
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
        return body
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
