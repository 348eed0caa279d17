"""Which build of taskgate runs: the hot path compiled with mypyc, or pure Python."""

from __future__ import annotations

import importlib
import os
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

# A module of every compiled build (the list in pyproject.toml): whether it loaded from an
# extension says which build runs.
_WITNESS = "gateway.h1.server"


def compiled() -> bool:
    witness = importlib.import_module(_WITNESS)
    return (getattr(witness, "__file__", None) or "").endswith(tuple(EXTENSION_SUFFIXES))


def describe() -> str:
    """The build, for --version and the log: compiled with mypyc (and how many modules), or
    pure Python (and why)."""
    if compiled():
        package = Path(__file__).parent
        found = {path for suffix in EXTENSION_SUFFIXES for path in package.rglob(f"*{suffix}")}
        count = len(found)
        return f"compiled with mypyc ({count} modules)"
    if os.environ.get("TASKGATE_PURE", "") not in ("", "0"):
        return "pure Python (TASKGATE_PURE is set)"
    return "pure Python"
