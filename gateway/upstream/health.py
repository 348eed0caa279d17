"""Replica health: active server/discover probes, passive ejection after consecutive failures."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gateway.config import HealthConfig
from gateway.store.base import TaskRoute
from gateway.upstream.calls import UpstreamCallError, call
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend, Replica

log = logging.getLogger("taskgate.health")


@dataclass(slots=True)
class State:
    healthy: bool = True  # presumed healthy until shown otherwise
    failures: int = 0  # consecutive
    successes: int = 0  # consecutive


class Health:
    """Tracks each replica; the route picks among healthy ones, probes and calls report here.

    Calls report only what the replica did (gateway/upstream/attempt.py keeps the rule): an
    outcome the client caused, a 4xx, or a tools/call slower than its deadline reports
    nothing, so one client cannot eject a replica that serves everyone else."""

    def __init__(self, config: HealthConfig) -> None:
        self._config = config
        self._states: dict[str, State] = {}
        self.ejections: dict[tuple[str, str], int] = {}  # (backend, replica label), for /metrics

    def reconfigure(self, config: HealthConfig, kept: set[str]) -> None:
        """A reload's thresholds. Replicas that stay keep their state (Health is keyed by URL);
        one removed and later added back starts as a new one."""
        self._config = config
        for url in [url for url in self._states if url not in kept]:
            del self._states[url]

    def healthy(self, replica: Replica) -> bool:
        state = self._states.get(replica.url)
        return state is None or state.healthy

    def success(self, replica: Replica) -> None:
        state = self._states.get(replica.url)
        if state is None:  # not setdefault: every call would build a State to throw away
            state = self._states[replica.url] = State()
        state.failures = 0
        state.successes += 1
        if not state.healthy and state.successes >= self._config.healthy_after:
            state.healthy = True
            log.warning("replica %s of %s is healthy again", replica.label, replica.backend)

    def failure(self, replica: Replica) -> None:
        state = self._states.setdefault(replica.url, State())
        state.successes = 0
        state.failures += 1
        if state.healthy and state.failures >= self._config.unhealthy_after:
            state.healthy = False
            key = (replica.backend, replica.label)
            self.ejections[key] = self.ejections.get(key, 0) + 1
            log.warning(
                "replica %s of %s is ejected after %d failures",
                replica.label,
                replica.backend,
                state.failures,
            )

    def rotation(self, backend: Backend) -> list[Replica]:
        """The healthy replicas in turn (the next first); empty when none is healthy."""
        return [replica for replica in backend.rotation() if self.healthy(replica)]


# Whether a replica of a backend is known to speak the 2025 era (gateway/bridge/eras.py).
Speaks2025 = Callable[[Backend, Replica], bool]


class Prober:
    """Asks every replica for server/discover every `interval_s`, all replicas at once. A
    replica known to speak the 2025 era (`speaks_2025`) answers it with a refusal, which says it
    is there; any other replica's refusal is a failure, as ever."""

    def __init__(
        self,
        pool: Pool,
        backends: dict[str, Backend],
        health: Health,
        config: HealthConfig,
        speaks_2025: Speaks2025,
    ) -> None:
        self._pool = pool
        self._backends = backends
        self._health = health
        self._config = config
        self._speaks_2025 = speaks_2025
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def probe_all(self) -> None:
        probes = [
            self._probe(backend, replica)
            for backend in self._backends.values()
            for replica in backend.replicas
        ]
        await asyncio.gather(*probes)

    async def _run(self) -> None:
        while True:
            await self.probe_all()
            await asyncio.sleep(self._config.interval_s)

    async def _probe(self, backend: Backend, replica: Replica) -> None:
        try:
            await call(
                self._pool,
                replica,
                "server/discover",
                timeout_s=self._config.timeout_s,
                headers=backend.credentials,
            )
        except UpstreamCallError as refused:
            if self._speaks_2025(backend, replica) and _answered(refused):
                self._health.success(replica)
            else:
                self._health.failure(replica)
        else:
            self._health.success(replica)


def _answered(refused: UpstreamCallError) -> bool:
    """Whether a refused probe is an answer (a 2025-era server's to a method it does not know:
    a 400 for the missing session, a -32601), not a 5xx or a refusal of taskgate's credential
    or of its load."""
    status = refused.status
    return status is not None and status < 500 and status not in (401, 403, 429)


def task_replicas(
    backends: Mapping[str, Backend], health: Health, route: TaskRoute
) -> list[Replica]:
    """The replicas that may answer for a task: its owner; or, when the backend's replicas
    share a task store, any of them, healthy ones first. None when its backend or owner has
    left the configuration."""
    backend = backends.get(route.backend)
    if backend is None:
        return []
    if backend.task_affinity == "backend":
        return health.rotation(backend) or backend.rotation()
    owner = backend.replica(route.replica)
    return [owner] if owner is not None else []
