"""One timer for the successive deadlines of an upstream connection's exchanges
(gateway/upstream/connection.py).

An exchange after another on a pooled connection has a later deadline than the one before, so
the timer armed for the first is left where it is: when it fires it finds the deadline that
holds now and, if that is still ahead, moves itself there. Arming and cancelling a timer per
exchange cost about 3% of a proxied request's CPU (docs/performance.md); this arms one per
deadline period of a busy connection. A sooner deadline than the armed timer (rare) re-arms it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Deadline:
    """When the current exchange must be done (None: no deadline), and what to do past it."""

    __slots__ = ("_at", "_expire", "_loop", "_timer", "_timer_at")

    def __init__(self, loop: asyncio.AbstractEventLoop, expire: Callable[[], None]) -> None:
        self._loop = loop
        self._expire = expire  # called once the deadline set last has passed
        self._at: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def set(self, at: float) -> None:
        self._at = at
        timer = self._timer
        if timer is not None:
            if self._timer_at <= at:
                return  # it fires first, and moves itself to `at`
            timer.cancel()
        self._arm(at)

    def clear(self) -> None:
        """No deadline now; an armed timer stays, and finds none when it fires."""
        self._at = None

    def stop(self) -> None:
        """No deadline and no timer (the connection is closed: the timer must not keep it)."""
        self._at = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, at: float) -> None:
        self._timer = self._loop.call_at(at, self._fired)
        self._timer_at = at

    def _fired(self) -> None:
        self._timer = None
        at = self._at
        if at is None:
            return  # armed for an exchange that ended
        if self._loop.time() < at:  # armed for an earlier exchange: on to this one's
            self._arm(at)
            return
        self._at = None
        self._expire()
