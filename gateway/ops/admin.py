"""The admin listener: probes (/healthz, /readyz) and the operator's tools (the status page at /,
/metrics, POST /reload, /tasks/<id>).

It listens on loopback by default. Off loopback, the operator's tools require the admin's own
bearer token (`admin.bearer_env`): a task route names its owner and principal, and a reload
changes what taskgate serves. The probes stay open to the orchestrator's kubelet, whatever its
Host and Origin.

On loopback no token is needed, so any web page the operator's browser opens can send requests
here, and read the answers through a DNS name rebound to 127.0.0.1. The operator's tools get
the public listener's guard (gateway/pipeline/guard.py, from `admin.allowed_origins` and
`admin.allowed_hosts`): a present Origin must be loopback or listed, and on a loopback listener
the Host must be a loopback name or listed. Off loopback the Host is not checked, as on the
public listener: Prometheus scrapes /metrics with the pod's IP as Host, and the token, which no
page can make a browser send, is the check there. A POST must carry `X-Taskgate-Admin`
(gateway/ops/admin_client.py), which no page can send cross-site without a preflight, which this
listener never grants.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.config import AdminConfig
from gateway.config.loopback import is_loopback
from gateway.ops.admin_client import ADMIN_HEADER
from gateway.ops.exposition import metrics
from gateway.ops.inspect_task import task_route
from gateway.ops.readiness import readiness
from gateway.ops.reload import RELOADER, Reloader, reload_endpoint
from gateway.ops.status_page import status_page
from gateway.pipeline.guard import Guard
from gateway.pipeline.state import GATEWAY, Gateway

_OPEN = frozenset({"/healthz", "/readyz"})
# Methods a page may send cross-site without a preflight and without changing anything here.
_SAFE = frozenset({"GET", "HEAD"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_admin_app(gateway: Gateway, reloader: Reloader | None = None) -> web.Application:
    admin = web.Application(middlewares=[_guard(gateway)])
    admin[GATEWAY] = gateway
    if reloader is not None:
        admin[RELOADER] = reloader
    admin.router.add_get("/healthz", healthz)
    admin.router.add_get("/readyz", readyz)
    admin.router.add_get("/", status_page)
    admin.router.add_get("/metrics", metrics)
    admin.router.add_post("/reload", reload_endpoint)
    admin.router.add_get("/tasks/{task_id}", task_route)
    return admin


def admin_token(gateway: Gateway) -> str | None:
    """The admin's own bearer token, from the variable `admin.bearer_env` names (read when the
    listener starts); None when none is configured."""
    admin = gateway.config.admin
    if admin is None or admin.bearer_env is None:
        return None
    return os.environ.get(admin.bearer_env) or None


def _guard(gateway: Gateway) -> Any:
    token = admin_token(gateway)
    admin = gateway.config.admin or AdminConfig()
    on_loopback = is_loopback(admin.host)
    expected = f"Bearer {token}".encode() if token is not None else None
    browsers = Guard(admin)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in _OPEN:
            return await handler(request)
        _refuse_browsers(request, browsers)
        if expected is None and not on_loopback:
            raise web.HTTPForbidden(
                text="taskgate's admin listener is not on loopback: its operator paths need "
                "admin.bearer_env (the variable holding the admin token)\n"
            )
        given = request.headers.get("Authorization", "").encode()
        if expected is not None and not hmac.compare_digest(given, expected):
            raise web.HTTPUnauthorized(
                text="this admin path needs the admin bearer token (admin.bearer_env)\n",
                headers={"WWW-Authenticate": 'Bearer realm="taskgate-admin"'},
            )
        if request.method not in _SAFE and ADMIN_HEADER not in request.headers:
            raise web.HTTPForbidden(
                text=f"Forbidden: a {request.method} on taskgate's admin listener needs the "
                f"header {ADMIN_HEADER}: 1 (taskgate reload sends it)\n"
            )
        return await handler(request)

    return guard


def _refuse_browsers(request: web.Request, browsers: Guard) -> None:
    """403 for what only a browser sends on another site's behalf: a foreign Origin, or a
    Host that is not this loopback listener's name (a rebound DNS name)."""
    if not browsers.origin_allowed(request.headers.get("Origin")):
        raise web.HTTPForbidden(
            text="Forbidden: this Origin may not call taskgate's admin listener "
            "(admin.allowed_origins)\n"
        )
    if not browsers.host_allowed(request.headers.get("Host")):
        raise web.HTTPForbidden(
            text="Forbidden: this Host name is not served by taskgate's admin listener "
            "(admin.allowed_hosts)\n"
        )


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    """Ready when the store answers, every backend has a healthy replica, and taskgate is not
    draining; the body names each part, so an operator sees what is not ready. With workers,
    the instance is ready when every worker is (each listed under `workers`);
    `/readyz?worker=N` answers for worker N alone."""
    gateway = request.app[GATEWAY]
    body = await readiness(gateway)
    board = gateway.board
    if board is not None:
        workers = board.workers(body)
        asked = request.query.get("worker")
        if asked is not None:
            one = next((w for w in workers if str(w["worker"]) == asked), None)
            if one is None:
                raise web.HTTPNotFound(
                    text=f"no worker {asked}; workers are 0..{board.count - 1}\n"
                )
            return web.json_response(one, status=200 if one["ready"] else 503)
        body = {**body, "ready": all(w["ready"] for w in workers), "workers": workers}
    return web.json_response(body, status=200 if body["ready"] else 503)
