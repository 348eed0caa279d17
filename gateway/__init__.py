"""taskgate: an MCP 2026-07-28 gateway that routes the Tasks extension across replicas."""

import os

__version__ = "0.1.0"

# The pure build on demand, even where compiled modules exist (gateway/_pure.py).
if os.environ.get("TASKGATE_PURE", "") not in ("", "0"):
    from gateway import _pure

    _pure.install()


def build() -> str:
    """Which build runs: "compiled (mypyc, N modules)" or "pure Python" (and why)."""
    from gateway import _build

    return _build.describe()
