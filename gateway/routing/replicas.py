"""Backends and their replicas; a tools/call takes the next replica in round-robin order."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gateway.config import BackendConfig


@dataclass(frozen=True, slots=True)
class Replica:
    backend: str
    url: str

    @property
    def label(self) -> str:
        """host:port, for logs (never the full URL, which may carry a path secret)."""
        parts = urlsplit(self.url)
        return parts.netloc


@dataclass(slots=True)
class Backend:
    name: str
    replicas: tuple[Replica, ...]
    timeout_s: float
    task_timeout_s: float
    task_affinity: str
    _turn: itertools.cycle[Replica] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._turn = itertools.cycle(self.replicas)

    @classmethod
    def from_config(cls, name: str, config: BackendConfig) -> Backend:
        return cls(
            name=name,
            replicas=tuple(Replica(name, url) for url in config.replicas),
            timeout_s=config.timeout_s,
            task_timeout_s=config.task_timeout_s,
            task_affinity=config.task_affinity,
        )

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
