"""The typed state one taskgate process shares between its requests."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from aiohttp import web

from gateway.auth.authenticator import Authenticator
from gateway.bridge.callers import CallerSessions
from gateway.catalog.discovery import Catalog
from gateway.catalog.table import RouteTable
from gateway.config import Config
from gateway.legacy.door import FrontDoor
from gateway.limits.limiter import Limiter
from gateway.listen.hub import ListenHub
from gateway.observe.board import WorkerBoard
from gateway.observe.history import ConfigHistory
from gateway.observe.observer import Observer
from gateway.pipeline.coordinator import Coordinator
from gateway.pipeline.guard import Guard
from gateway.tasks.made import MadeTasks
from gateway.tasks.routes import TaskRouter
from gateway.upstream.health import Health, Prober
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend


@dataclass(slots=True)
class Gateway:
    config: Config
    routes: RouteTable
    backends: dict[str, Backend]
    guard: Guard
    session: aiohttp.ClientSession  # the JWKS fetch: the one HTTP client not to a replica
    pool: Pool  # every connection to a replica: the relay's, taskgate's own calls, listens
    catalog: Catalog
    tasks: TaskRouter
    made: MadeTasks  # the tasks taskgate runs itself (a route's task.mode)
    auth: Authenticator
    coordinator: Coordinator
    limits: Limiter  # each tenant's and principal's fair share (the `limits` section)
    health: Health
    listens: ListenHub  # subscriptions/listen streams, their pollers and list watcher
    observer: Observer  # each answered request: metrics, request log, recent failures
    history: ConfigHistory  # the running configuration's version and its reloads
    prober: Prober  # the active health probes of `backends`; a reload replaces both
    # Callers' sessions on the backends' 2025-era replicas (gateway/bridge); a reload
    # reconfigures them.
    callers: CallerSessions
    # 2025-era clients (gateway/legacy); None when legacy.enabled is off.
    legacy: FrontDoor | None = None
    # With --workers: the other workers' published numbers, for /metrics and /readyz.
    board: WorkerBoard | None = None


GATEWAY = web.AppKey("gateway", Gateway)
