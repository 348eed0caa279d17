"""Servers of the 2025 era for the bridge tests, started as real processes on loopback: the
Python SDK 1.x (`mcp<2`, FastMCP over Streamable HTTP), in the venv `make .venv-mcp1/.installed`
builds (it cannot share taskgate's, which holds the SDK 2.x), and the TypeScript SDK 1.x
(tests/clients/ts1/server.mjs, the package installed by prepare_node_project); each stateful
or stateless, each with the same tools, prompt, resource and template."""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.mcp import mcp_exchange
from tests.support.node import NodeProject
from tests.support.procs import REPO_ROOT, BackendProcess, ProcessStartError

MCP1_PYTHON = REPO_ROOT / ".venv-mcp1" / "bin" / "python"
PY_SDK1_SERVER = REPO_ROOT / "tests" / "era2025" / "py_sdk1_server.py"
TS1_DIR = REPO_ROOT / "tests" / "clients" / "ts1"
TS_SDK1_SERVER = TS1_DIR / "server.mjs"
TS_SDK_PACKAGE = "@modelcontextprotocol/sdk"


class Era2025Process(BackendProcess):
    """A 2025-era server; the same READY line, restart and stop as BackendProcess. `marks` is
    the file its `wait` tool notes each call's start and cancellation in."""

    def __init__(self, name: str, *, stateless: bool = False) -> None:
        super().__init__(name)
        self.stateless = stateless
        self.marks = Path(tempfile.mkdtemp(prefix=f"taskgate-era2025-{name}-")) / "marks"
        self.marks.touch()

    def server_argv(self) -> list[str]:
        """The command that runs the server, before its options."""
        raise NotImplementedError

    @property
    def argv(self) -> list[str]:
        argv = [*self.server_argv(), "--name", self.name, "--port", str(self._port)]
        argv += ["--marks-file", str(self.marks)]
        return [*argv, "--stateless"] if self.stateless else argv

    def noted(self) -> list[str]:
        """What its `wait` tool noted, in order: "started <mark>", "cancelled <mark>"."""
        return self.marks.read_text(encoding="utf-8").splitlines()

    def cleanup(self) -> None:
        super().cleanup()
        self.marks.unlink(missing_ok=True)
        self.marks.parent.rmdir()


class PySDK1Process(Era2025Process):
    """tests/era2025/py_sdk1_server.py, on the Python SDK 1.x."""

    def server_argv(self) -> list[str]:
        if not MCP1_PYTHON.exists():
            raise ProcessStartError(
                f"{MCP1_PYTHON} is missing: `make .venv-mcp1/.installed` builds it "
                "(`make test` does)"
            )
        return [str(MCP1_PYTHON), str(PY_SDK1_SERVER)]


class TSSDK1Process(Era2025Process):
    """tests/clients/ts1/server.mjs, on the TypeScript SDK 1.x, run by `node`."""

    def __init__(
        self, name: str, node: str, *, stateless: bool = False, resumable: bool = False
    ) -> None:
        super().__init__(name, stateless=stateless)
        self.node = node
        self.resumable = resumable  # its sessions keep their events, for Last-Event-ID

    def server_argv(self) -> list[str]:
        return [self.node, str(TS_SDK1_SERVER), *(["--resumable"] if self.resumable else [])]


# Every kind of test server: each SDK, stateful and stateless.
SERVERS = ["py-sdk1", "py-sdk1-stateless", "ts-sdk1", "ts-sdk1-stateless"]
# One backend, "old", serving everything the test servers offer.
ROUTES: list[tuple[list[str], str] | dict[str, Any]] = [
    {
        "tools": ["*"],
        "prompts": ["*"],
        "resources": ["note://*"],
        "resource_templates": ["note://by/{topic}"],
        "backend": "old",
    }
]
_ids = itertools.count(1)


@contextmanager
def started(
    kind: str, node_project: NodeProject, *, name: str | None = None
) -> Iterator[Era2025Process]:
    """A server of `kind` (SERVERS) running, named `name` (by default its kind: what its
    whoami answers), stopped and cleaned up at the end."""
    stateless = kind.endswith("-stateless")
    server: Era2025Process
    if kind.startswith("ts-"):
        server = TSSDK1Process(name or kind, node_project.require(), stateless=stateless)
    else:
        server = PySDK1Process(name or kind, stateless=stateless)
    try:
        yield server.start()
    finally:
        server.cleanup()


async def exchange(
    url: str,
    method: str,
    params: dict[str, Any],
    *,
    token: str | None = None,
    tasks: bool = True,
) -> list[dict[str, Any]]:
    """Every message of the answer (JSON, or each event of a stream), after a 200; `tasks`:
    the request declares the Tasks extension."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http:
        status, messages = await mcp_exchange(
            http, url, method, params, id=next(_ids), headers=headers, tasks=tasks
        )
    assert status == 200, messages
    return messages


async def call(
    url: str,
    method: str,
    params: dict[str, Any],
    *,
    token: str | None = None,
    tasks: bool = True,
) -> dict[str, Any]:
    """The result of one request."""
    messages = await exchange(url, method, params, token=token, tasks=tasks)
    answer = messages[-1]
    assert "result" in answer, messages
    result: dict[str, Any] = answer["result"]
    return result


def text(result: dict[str, Any]) -> str:
    """The text of a call's first content block."""
    value: str = result["content"][0]["text"]
    return value
