"""Reload without restart: SIGHUP, POST /reload on the admin listener, `taskgate reload`
(gateway/ops/reload_command.py); what a reload may change is gateway/ops/reload_changes.py's.

A reload reads the file the process was started from and validates it as `taskgate check`
does. What the running process was built with and cannot rebuild (the listeners, the store,
the request log) must not change: such an edit is refused, naming each key, and the running
configuration stays as it was. Otherwise the parts that depend on backends and routes are
built beside the running ones, the catalogue looks at the backends once, and then everything
is swapped into the one Gateway in a single synchronous step: a request reads `gateway.routes`,
`gateway.backends`, ... at each use, so it sees either the old configuration or the new one,
and a request in flight keeps the objects it holds. What carries state across is kept: the
store and the task routes' cache, the coordinator's in-flight table, replica health (by URL),
the relay's connections, listen streams. Finally the replaced prober stops and the replaced
catalogue's refreshes end.

A task whose owning replica (or backend) a reload removed answers 503 retryable until its
route expires or the replica comes back (gateway/pipeline/modern.py): its route is sound, only its
owner is out of reach.

With `--workers N` (gateway/process/workers.py) each worker reloads itself: SIGHUP to the supervisor
is forwarded to every worker; POST /reload on worker 0 (the one with the admin listener)
reloads worker 0, then asks the supervisor (SIGUSR1) to send SIGHUP to the others. Worker 0
answers for itself: the others read the same file and log their own outcome.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gateway.auth.authenticator import Authenticator
from gateway.catalog.discovery import Catalog
from gateway.catalog.table import RouteTable
from gateway.config import Config, ConfigError, load_config
from gateway.errors import Retryable, StartupError
from gateway.observe.history import Reload, config_version
from gateway.ops.reload_changes import describe_changes, needs_restart
from gateway.pipeline.guard import Guard
from gateway.pipeline.parts import (
    backend_limits,
    build_authenticator,
    build_backends,
    build_catalog,
    default_head_limits,
    list_poll_s,
    replica_head_limits,
)
from gateway.pipeline.state import GATEWAY, Gateway
from gateway.upstream.health import Prober
from gateway.upstream.replicas import Backend

log = logging.getLogger("taskgate")

SIGHUP = "SIGHUP"
ADMIN = "admin"
# Set by gateway/process/workers.py in each worker: the supervisor's pid, which forwards a reload
# worker 0 applied to the other workers.
SUPERVISOR_ENV = "TASKGATE_SUPERVISOR_PID"
RELOAD_OTHERS = signal.SIGUSR1  # worker 0 -> supervisor: SIGHUP every other worker
# The catalogue's first look at the backends, before the swap, so that the first calls after
# a reload find their tools known; a backend silent this long is looked at again on first use.
WARM_S = 6.0


class Reloader:
    """Reloads one process's configuration from the file it was started from; one at a time."""

    def __init__(self, state: Gateway, path: str) -> None:
        self.state = state
        self.path = path
        self._lock = asyncio.Lock()  # two reloads at once run one after the other
        self._supervisor = _supervisor_pid()

    async def reload(self, trigger: str) -> Reload:
        """Validate the file, then apply it or refuse it; recorded in `state.history` and
        logged either way. Never raises but for cancellation (a SIGHUP's task has no one to
        raise to)."""
        async with self._lock:
            replaced: _Replaced | None = None
            try:
                entry, replaced = await self._reload(trigger)
            except Exception as exc:
                log.exception("reload (%s) failed unexpectedly", trigger)
                entry = self._refuse(trigger, [f"unexpected failure: {exc!r}"])
            self.state.history.record(entry)  # before any await: the swap is done
            if replaced is not None:
                await replaced.retire()
            return entry

    def signal_other_workers(self) -> bool:
        """In worker 0 of `taskgate run --workers N`: ask the supervisor to send SIGHUP to the
        other workers; False when this process is not such a worker."""
        pid = self._supervisor
        if pid is None or os.getppid() != pid:  # not a worker, or its supervisor is gone
            return False
        os.kill(pid, RELOAD_OTHERS)
        return True

    async def _reload(self, trigger: str) -> tuple[Reload, _Replaced | None]:
        """The reload's record, and what it replaced (to retire) when it was applied."""
        state = self.state
        if state.coordinator.draining:
            return self._refuse(trigger, ["taskgate is shutting down"]), None
        try:
            text, config = await asyncio.to_thread(read_config, self.path)
        except ConfigError as invalid:
            return self._refuse(trigger, invalid.problems), None
        problems = needs_restart(state.config, config)
        if problems:
            return self._refuse(trigger, problems), None
        try:
            parts = _build(config, state)
        except StartupError as unusable:
            return self._refuse(trigger, [str(unusable)]), None
        try:
            await _warm(parts.catalog)
        except BaseException:
            await parts.catalog.close()
            raise
        if state.coordinator.draining:  # stopping began while the catalogue looked
            await parts.catalog.close()
            return self._refuse(trigger, ["taskgate is shutting down"]), None
        changes = describe_changes(state.config, config)
        replaced = _swap(state, config, parts)
        parts.prober.start()
        parts.catalog.warm()
        version = config_version(text)
        log.info(
            "reloaded %s (%s; version %s): %s", self.path, trigger, version, "; ".join(changes)
        )
        entry = Reload(
            at=time.time(),
            version=version,
            applied=True,
            problems=(),
            changes=tuple(changes),
            trigger=trigger,
        )
        return entry, replaced

    def _refuse(self, trigger: str, problems: list[str]) -> Reload:
        version = self.state.history.version
        for problem in problems:
            log.warning(
                "reload (%s) of %s refused, version %s keeps running: %s",
                trigger,
                self.path,
                version,
                problem,
            )
        return Reload(
            at=time.time(),
            version=version,
            applied=False,
            problems=tuple(problems),
            changes=(),
            trigger=trigger,
        )


def read_config(path: str) -> tuple[bytes, Config]:
    """The file's bytes (its version) and the configuration `taskgate check` makes of them
    (ConfigError, in check's words)."""
    text = _read(path)
    config = load_config(path)
    if _read(path) != text:  # an editor wrote it while it was read: the version would lie
        raise ConfigError(path, ["the file changed while it was read; reload again"])
    return text, config


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(path, [f"cannot read: {exc.strerror}"]) from None


@dataclass(slots=True)
class _Parts:
    """What a reload builds beside the running parts before swapping them in."""

    backends: dict[str, Backend]
    routes: RouteTable
    catalog: Catalog
    prober: Prober
    guard: Guard
    auth: Authenticator | None  # None: the running one stays (its keys and token cache)


def _build(config: Config, state: Gateway) -> _Parts:
    """The backend- and route-dependent parts of `config`, as gateway_state builds them;
    reads credentials and keys (StartupError). Nothing runs yet."""
    backends = build_backends(config)
    routes = RouteTable(config.routes)
    auth: Authenticator | None = None
    # Static keys are read again (a key file may have been rotated); keys from a JWKS URL
    # refresh on their own, so an unchanged auth section keeps its authenticator.
    if config.auth != state.config.auth or config.auth.keys:
        auth = build_authenticator(config.auth, state.session)
    catalog = build_catalog(config, state.pool, backends, routes)
    return _Parts(
        backends=backends,
        routes=routes,
        catalog=catalog,
        prober=Prober(state.pool, backends, state.health, config.health, catalog.eras.speaks_2025),
        guard=Guard(config.listen),
        auth=auth,
    )


async def _warm(catalog: Catalog) -> None:
    """One look at the routed backends, bounded: the running catalogue serves meanwhile."""
    try:
        async with asyncio.timeout(WARM_S):
            await catalog.views()
    except (Retryable, TimeoutError, aiohttp.ClientError):
        pass  # a silent backend is asked again on first use, as at start


@dataclass(slots=True)
class _Replaced:
    """The parts a reload took out of service."""

    catalog: Catalog
    prober: Prober

    async def retire(self) -> None:
        """Stop the replaced probes and catalogue refreshes. Requests that still hold the
        catalogue may go on using it: closing ends only its background refreshes."""
        await self.prober.stop()
        await self.catalog.close()


def _swap(state: Gateway, config: Config, parts: _Parts) -> _Replaced:
    """Put `parts` in place in one synchronous step: no request sees half a reload."""
    replaced = _Replaced(state.catalog, state.prober)
    running = state.config
    state.config = config
    state.backends = parts.backends
    state.routes = parts.routes
    state.catalog = parts.catalog
    state.prober = parts.prober
    state.guard = parts.guard
    if parts.auth is not None:
        state.auth = parts.auth
    # The relay's connections stay; replicas whose answer-head limits moved get theirs.
    before, after = replica_head_limits(running), replica_head_limits(config)
    default = default_head_limits(config)  # listen.* is unchanged (needs_restart)
    for url in before.keys() | after.keys():
        if before.get(url) != after.get(url):
            state.pool.limit(url, after.get(url, default))
    # Kept objects told their new settings: in-flight counts, route cache and replica states stay.
    state.coordinator.reconfigure(backend_limits(config), config.tenant_share)
    state.limits.reconfigure(config.limits, config.principal_defaults())
    state.coordinator.limit(state.limits.policy.concurrency)
    state.tasks.reconfigure(config.tasks, sharing=config.auth.task_sharing)
    state.made.reconfigure(
        config.tasks.made,
        sharing=config.auth.task_sharing,
        record_timeout_s=config.tasks.record_timeout_s,
    )
    state.callers.reconfigure(parts.backends)
    health = state.health
    health.reconfigure(
        config.health, {url for backend in config.backends.values() for url in backend.replicas}
    )
    state.listens.reconfigure(
        config.subscriptions,
        catalog=parts.catalog,
        table=parts.routes,
        backends=parts.backends,
        health=health,
        list_poll_s=list_poll_s(config),
    )
    if state.legacy is not None:
        state.legacy.reconfigure(config.legacy)
    return replaced


def _supervisor_pid() -> int | None:
    value = os.environ.get(SUPERVISOR_ENV, "")
    return int(value) if value.isdigit() else None


RELOADER = web.AppKey("reloader", Reloader)  # absent: not started from a file


async def reload_endpoint(request: web.Request) -> web.Response:
    """POST /reload: 200 and what changed when applied; 400 and each problem when refused;
    409 when this taskgate was not started from a file."""
    reloader = request.app.get(RELOADER)
    if reloader is None:
        gateway = request.app[GATEWAY]
        problem = "this taskgate was not started from a configuration file: nothing to reload"
        body: dict[str, Any] = {
            "applied": False,
            "version": gateway.history.version,
            "problems": [problem],
            "changes": [],
        }
        return web.json_response(body, status=409)
    entry = await reloader.reload(ADMIN)
    others = reloader.signal_other_workers() if entry.applied else False
    body = {
        "applied": entry.applied,
        "version": entry.version,
        "problems": list(entry.problems),
        "changes": list(entry.changes),
        "workers_signalled": others,
    }
    return web.json_response(body, status=200 if entry.applied else 400)
