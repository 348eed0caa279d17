"""Backends and their replicas; a tools/call takes the next replica in round-robin order."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from gateway.config import BackendConfig
from gateway.errors import StartupError


@dataclass(frozen=True, slots=True)
class Replica:
    backend: str
    url: str
    # A JSON answer (or a 4xx body) is read whole before it is relayed: at most this much.
    max_answer_bytes: int = 64 * 1024 * 1024
    # host:port, for logs and metric labels (never the full URL, which may carry a path
    # secret); computed once, since every request's record names its replica.
    label: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "label", urlsplit(self.url).netloc)


@dataclass(slots=True)
class Backend:
    name: str
    replicas: tuple[Replica, ...]
    timeout_s: float
    task_timeout_s: float
    task_affinity: str
    # taskgate's own credential for this backend (never the client's), on every upstream call.
    credentials: dict[str, str] = field(default_factory=dict)
    # Header names that carry the verified tenant and principal upstream, when configured.
    tenant_header: str | None = None
    principal_header: str | None = None
    # backends.X.era, and the limits of the callers' sessions on its 2025-era replicas.
    era: str = "auto"
    sessions_per_replica: int = 256
    session_idle_s: float = 600.0
    input_wait_s: float = 300.0
    waiting_per_replica: int = 64
    _turn: itertools.cycle[Replica] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._turn = itertools.cycle(self.replicas)

    @classmethod
    def from_config(cls, name: str, config: BackendConfig) -> Backend:
        return cls(
            name=name,
            replicas=tuple(Replica(name, url, config.max_answer_bytes) for url in config.replicas),
            timeout_s=config.timeout_s,
            task_timeout_s=config.task_timeout_s,
            task_affinity=config.task_affinity,
            credentials=_credentials(name, config),
            tenant_header=config.identity_headers.tenant,
            principal_header=config.identity_headers.principal,
            era=config.era,
            sessions_per_replica=config.sessions.max_per_replica,
            session_idle_s=config.sessions.idle_s,
            input_wait_s=config.sessions.input_wait_s,
            waiting_per_replica=config.sessions.max_waiting_per_replica,
        )

    def identity(self, tenant: str, subject: str) -> dict[str, str]:
        """The identity headers for a call made on behalf of this caller."""
        headers = {}
        if self.tenant_header:
            headers[self.tenant_header] = tenant
        if self.principal_header:
            headers[self.principal_header] = subject
        return headers

    def pick(self) -> Replica:
        """The next replica in turn; health-aware selection replaces this with its own policy."""
        return next(self._turn)

    def rotation(self) -> list[Replica]:
        """Every replica, starting with the next in turn: the order to fail over in."""
        first = self.pick()
        start = self.replicas.index(first)
        return [*self.replicas[start:], *self.replicas[:start]]

    def replica(self, url: str) -> Replica | None:
        """The configured replica with this URL (task routes name their owner by URL)."""
        return next((r for r in self.replicas if r.url == url), None)


def _credentials(name: str, config: BackendConfig) -> dict[str, str]:
    auth = config.upstream_auth
    if auth is None:
        return {}
    if auth.bearer_env is not None:
        token = os.environ.get(auth.bearer_env, "").strip()
        where = f"${auth.bearer_env}"
    else:
        assert auth.bearer_file is not None
        try:
            token = Path(auth.bearer_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise StartupError(
                f"backends.{name}.upstream_auth: cannot read {auth.bearer_file}: {exc.strerror}"
            ) from None
        where = auth.bearer_file
    if not token:
        raise StartupError(f"backends.{name}.upstream_auth: {where} holds no token")
    if any(c in token for c in "\r\n\0"):
        raise StartupError(
            f"backends.{name}.upstream_auth: the token in {where} contains a line break or NUL"
        )
    return {"Authorization": f"Bearer {token}"}
