"""With `--workers N`: each worker's loop that publishes its readiness and metrics to the board
(gateway/observe/board.py) for the first worker's /metrics and /readyz."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

from gateway.observe.board import PUBLISH_S, WorkerBoard
from gateway.ops.exposition import snapshot
from gateway.ops.readiness import readiness
from gateway.pipeline.state import Gateway


async def publish_forever(board: WorkerBoard, gateway: Gateway) -> None:
    """Each PUBLISH_S: this worker's readiness and metrics, for worker 0 to read."""
    while True:
        ready = await readiness(gateway)
        entry = {
            "at": time.time(),
            "pid": os.getpid(),
            "ready": ready,
            "metrics": snapshot(gateway),
        }
        with contextlib.suppress(OSError):  # a full disk must not stop a worker serving
            await asyncio.to_thread(board.publish, entry)
        await asyncio.sleep(PUBLISH_S)
