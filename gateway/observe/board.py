"""With `--workers N`: what each worker publishes for the first one's /metrics and /readyz.

Every worker writes its readiness and its metrics snapshot to `worker-<i>.json` in a folder the
supervisor made, each PUBLISH_S (written whole, then renamed: a reader never sees half a file).
Worker 0, which alone has the admin listener, adds the others' files to its own live numbers.
A scrape is therefore at most PUBLISH_S behind for the other workers; a file older than
STALE_S belongs to a worker that stopped publishing, and makes the instance not ready.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson

PUBLISH_S = 1.0
STALE_S = 5.0
_DIR = "TASKGATE_WORKERS_DIR"
_COUNT = "TASKGATE_WORKERS"
_INDEX = "TASKGATE_WORKER"


def announce(directory: str, count: int) -> None:
    """In the supervisor, before it starts the workers (they inherit its environment)."""
    os.environ[_DIR] = directory
    os.environ[_COUNT] = str(count)


def enlist(index: int) -> None:
    """In a worker, first thing: which one it is."""
    os.environ[_INDEX] = str(index)


class WorkerBoard:
    __slots__ = ("count", "directory", "index")

    def __init__(self, directory: Path, index: int, count: int) -> None:
        self.directory = directory
        self.index = index
        self.count = count

    @classmethod
    def from_environment(cls) -> WorkerBoard | None:
        """The board of this worker, or None when taskgate runs as one process."""
        directory, count, index = (os.environ.get(k) for k in (_DIR, _COUNT, _INDEX))
        if directory is None or count is None or index is None:
            return None
        return cls(Path(directory), int(index), int(count))

    def publish(self, entry: dict[str, Any]) -> None:
        path = self.directory / f"worker-{self.index}.json"
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(orjson.dumps(entry))
        os.replace(partial, path)

    def entries(self) -> dict[int, dict[str, Any] | None]:
        """Every other worker's last entry, None for one that never published or is unreadable."""
        found: dict[int, dict[str, Any] | None] = {}
        for index in range(self.count):
            if index == self.index:
                continue
            try:
                found[index] = orjson.loads((self.directory / f"worker-{index}.json").read_bytes())
            except (OSError, orjson.JSONDecodeError):
                found[index] = None
        return found

    def others(self) -> list[Any]:
        """The other workers' metrics snapshots that are not stale."""
        now = time.time()
        return [
            entry["metrics"]
            for entry in self.entries().values()
            if entry is not None and now - entry.get("at", 0) < STALE_S
        ]

    def workers(self, own: dict[str, Any]) -> list[dict[str, Any]]:
        """Each worker's readiness, this one's (`own`) included, as /readyz lists them."""
        now = time.time()
        listed = [{"worker": self.index, "pid": os.getpid(), "age_s": 0.0, **own}]
        for index, entry in self.entries().items():
            if entry is None:
                listed.append({"worker": index, "ready": False, "problem": "not published yet"})
                continue
            age = round(now - entry.get("at", 0), 1)
            ready = bool(entry.get("ready", {}).get("ready")) and age < STALE_S
            item = {"worker": index, "pid": entry.get("pid"), "age_s": age, **entry["ready"]}
            item["ready"] = ready
            if age >= STALE_S:
                item["problem"] = f"silent for {age:g} s"
            listed.append(item)
        listed.sort(key=lambda item: int(item["worker"]))
        return listed
