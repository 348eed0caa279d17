"""The admin listener: /healthz (the process is alive) and /readyz (it can serve)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from gateway.state import GATEWAY, Gateway
from gateway.store.base import StoreUnavailable

STORE_CHECK_TIMEOUT_S = 2.0


def make_admin_app(gateway: Gateway) -> web.Application:
    admin = web.Application()
    admin[GATEWAY] = gateway
    admin.router.add_get("/healthz", healthz)
    admin.router.add_get("/readyz", readyz)
    return admin


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    """Ready when the store answers, every backend has a healthy replica, and taskgate is not
    draining; the body names each part, so an operator sees what is not ready."""
    gateway = request.app[GATEWAY]
    store = "ok"
    try:
        async with asyncio.timeout(STORE_CHECK_TIMEOUT_S):
            await gateway.tasks.store.ping()
    except (StoreUnavailable, TimeoutError) as exc:
        store = f"unavailable: {exc}"
    backends: dict[str, Any] = {}
    for name, backend in gateway.backends.items():
        healthy = [r.label for r in backend.replicas if gateway.health.healthy(r)]
        backends[name] = {"healthy": len(healthy), "replicas": len(backend.replicas)}
    draining = gateway.coordinator.draining
    ready = store == "ok" and all(b["healthy"] for b in backends.values()) and not draining
    body = {
        "ready": ready,
        "store": store,
        "backends": backends,
        "draining": draining,
        "in_flight": gateway.coordinator.in_flight,
    }
    return web.json_response(body, status=200 if ready else 503)
