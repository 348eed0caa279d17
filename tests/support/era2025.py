"""Servers of the 2025 era for the bridge tests, started as real processes on loopback: the
Python SDK 1.x (`mcp<2`, FastMCP over Streamable HTTP), stateful or stateless, in the venv
`make .venv-mcp1/.installed` builds (it cannot share taskgate's, which holds the SDK 2.x)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests.support.procs import REPO_ROOT, BackendProcess, ProcessStartError

MCP1_PYTHON = REPO_ROOT / ".venv-mcp1" / "bin" / "python"
PY_SDK1_SERVER = REPO_ROOT / "tests" / "era2025" / "py_sdk1_server.py"


class PySDK1Process(BackendProcess):
    """One py_sdk1_server.py replica; the same READY line, restart and stop as BackendProcess.
    `marks` is the file its `wait` tool notes each call's start and cancellation in."""

    def __init__(self, name: str, *, stateless: bool = False) -> None:
        super().__init__(name)
        self.stateless = stateless
        self.marks = Path(tempfile.mkdtemp(prefix=f"taskgate-sdk1-{name}-")) / "marks"
        self.marks.touch()

    @property
    def argv(self) -> list[str]:
        if not MCP1_PYTHON.exists():
            raise ProcessStartError(
                f"{MCP1_PYTHON} is missing: `make .venv-mcp1/.installed` builds it "
                "(`make test` does)"
            )
        argv = [str(MCP1_PYTHON), str(PY_SDK1_SERVER), "--name", self.name]
        argv += ["--port", str(self._port), "--marks-file", str(self.marks)]
        return [*argv, "--stateless"] if self.stateless else argv

    def noted(self) -> list[str]:
        """What its `wait` tool noted, in order: "started <mark>", "cancelled <mark>"."""
        return self.marks.read_text(encoding="utf-8").splitlines()

    def cleanup(self) -> None:
        super().cleanup()
        self.marks.unlink(missing_ok=True)
        self.marks.parent.rmdir()
