"""The configuration a process runs, and what each reload did: for the status page, /metrics
and `taskgate reload`'s answer."""

from __future__ import annotations

import hashlib
import time
from collections import deque
from dataclasses import dataclass

MAX_ENTRIES = 20


def config_version(text: bytes) -> str:
    """A configuration's version: 12 hex digits of the SHA-256 of its file, so that two
    instances (or workers) running the same file say the same version."""
    return hashlib.sha256(text).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class Reload:
    at: float  # time.time()
    version: str  # of the file read; the running one when refused
    applied: bool
    problems: tuple[str, ...]  # why it was refused, as `taskgate check` says it
    changes: tuple[str, ...]  # what it changed (backends, replicas, routes), when applied
    trigger: str  # "SIGHUP" or "admin"


class ConfigHistory:
    """The running configuration's version, since when, and the last reloads (bounded)."""

    __slots__ = ("loaded_at", "path", "reloads", "started_at", "version")

    def __init__(self, version: str, path: str | None) -> None:
        self.version = version
        self.path = path  # the file `taskgate run --config` named; None when built in code
        self.started_at = self.loaded_at = time.time()
        self.reloads: deque[Reload] = deque(maxlen=MAX_ENTRIES)

    def record(self, entry: Reload) -> None:
        self.reloads.append(entry)
        if entry.applied:
            self.version = entry.version
            self.loaded_at = entry.at
