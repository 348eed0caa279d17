"""The `listing` backend (backends/listing.py) as a process: an MCPServer replica whose tools and
prompts change while it runs, each change pushed as list_changed on its listen streams."""

from __future__ import annotations

import sys

from tests.support.procs import LOOPBACK, PushingBackendProcess


class ListingBackendProcess(PushingBackendProcess):
    """One `python -m backends.listing` replica; the same READY line, restart and stop."""

    @property
    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "backends.listing", "--replica", self.name]
        return [*argv, "--port", str(self._port), "--host", LOOPBACK]
