"""TASKGATE_PURE=1: run the pure build although compiled modules lie beside the sources.

mypyc puts each compiled module's extension beside its .py file, and Python's import prefers an
extension. This finder, first on sys.meta_path, finds taskgate's own modules among the .py
files only, so one checkout runs either build (make test runs the suite on both).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import SOURCE_SUFFIXES, FileFinder, ModuleSpec, SourceFileLoader
from types import ModuleType


class PureFinder(MetaPathFinder):
    """Finds `gateway.*` modules in their package's folders, .py files only."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if not fullname.startswith("gateway.") or path is None:
            return None
        for entry in path:
            spec = FileFinder(entry, (SourceFileLoader, SOURCE_SUFFIXES)).find_spec(fullname)
            if spec is not None:
                return spec
        return None


def install() -> None:
    if not any(isinstance(finder, PureFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, PureFinder())
