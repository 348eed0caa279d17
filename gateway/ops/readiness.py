"""Whether this process can serve: the store answers, every backend has a healthy replica, and it
is not draining. /readyz answers it; with workers, each worker publishes its own."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.errors import StoreUnavailable
from gateway.pipeline.state import Gateway

STORE_CHECK_TIMEOUT_S = 2.0


async def readiness(gateway: Gateway) -> dict[str, Any]:
    """The body of /readyz: `ready`, and each part by name, so an operator sees what is not."""
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
    return {
        "ready": ready,
        "store": store,
        "backends": backends,
        "draining": draining,
        "in_flight": gateway.coordinator.in_flight,
    }
