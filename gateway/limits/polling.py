"""tasks/get kept to the task's pollIntervalMs (limits.polling; docs/limits.md, "Polling").

The last answer of each (task, caller) is kept, in process, until tolerance x pollIntervalMs
has passed: a tasks/get sooner than that gets it again (mode snapshot: the owner is not asked)
or 429 (mode refuse). Only a caller's own answer is kept for it, after its own route check, so
a snapshot tells no one anything the owner did not tell them. A tasks/update or tasks/cancel of
the caller drops it, so that what follows sees the change. A client that wants to be told at
once listens (subscriptions/listen) instead.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from typing import Any

from gateway.config.limits import PollingConfig

Key = tuple[str, str, str]  # (task id, tenant, principal)


class Snapshots:
    """The last tasks/get answers, at most max_snapshots (the oldest go)."""

    __slots__ = ("_kept", "config", "on")

    def __init__(self, config: PollingConfig) -> None:
        self._kept: OrderedDict[Key, tuple[dict[str, Any], float]] = OrderedDict()
        self.config = config
        self.on = config.mode != "off"

    def reconfigure(self, config: PollingConfig) -> None:
        self.config = config
        self.on = config.mode != "off"
        if not self.on:
            self._kept.clear()
        while len(self._kept) > config.max_snapshots:
            self._kept.popitem(last=False)

    def __len__(self) -> int:
        return len(self._kept)

    def early(self, key: Key) -> tuple[dict[str, Any], int] | None:
        """The kept result and the milliseconds left of its interval, when a tasks/get for
        `key` comes too soon; None when it may go to the owner."""
        found = self._kept.get(key)
        if found is None:
            return None
        result, until = found
        left = until - time.monotonic()
        if left <= 0:
            del self._kept[key]
            return None
        return result, max(1, math.ceil(left * 1000))

    def keep(self, key: Key, message: Any, expires_at_ms: int) -> None:
        """Keep a tasks/get answer's result for its pollIntervalMs (one without it: nothing),
        never past its route's expiry (`expires_at_ms`, wall clock): an expired task is not
        found, whatever its last answer said."""
        result = message.get("result") if isinstance(message, dict) else None
        interval = result.get("pollIntervalMs") if isinstance(result, dict) else None
        if not isinstance(result, dict) or type(interval) is not int or interval <= 0:
            self._kept.pop(key, None)
            return
        left_ms = min(interval * self.config.tolerance, expires_at_ms - time.time() * 1000)
        until = time.monotonic() + left_ms / 1000
        kept = self._kept
        kept[key] = (result, until)
        kept.move_to_end(key)
        if len(kept) > self.config.max_snapshots:
            kept.popitem(last=False)

    def forget(self, key: Key) -> None:
        self._kept.pop(key, None)
