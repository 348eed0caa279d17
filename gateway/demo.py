"""`taskgate demo`: two replicas of the report backend behind taskgate, on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import aiohttp
import orjson

from gateway.config import load_config
from gateway.protocol.meta import CLIENT_CAPABILITIES_KEY, PROTOCOL_VERSION_KEY, TASKS_EXTENSION

ROOT = Path(__file__).resolve().parent.parent
DEMO_CONFIG = ROOT / "config" / "demo.yaml"
READY_TIMEOUT_S = 60.0


def run_demo(port: int, backend_ports: list[int] | None = None) -> int:
    if not (ROOT / "backends" / "report.py").is_file():
        print("taskgate demo runs from a source checkout (it needs backends/).", file=sys.stderr)
        return 1
    config = load_config(DEMO_CONFIG)
    reports = config.backends["reports"]
    if backend_ports:
        urls = tuple(f"http://127.0.0.1:{p}/mcp" for p in backend_ports)
        reports = reports.model_copy(update={"replicas": urls})
    config = config.model_copy(
        update={
            "listen": config.listen.model_copy(update={"port": port}),
            "backends": {**config.backends, "reports": reports},
        }
    )
    replicas = reports.replicas
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for index, url in enumerate(replicas, start=1):
            procs.append(_start_backend(url, f"r{index}"))
        for proc, url in zip(procs, replicas, strict=True):
            _await_ready(proc, url)
        asyncio.run(_serve(config))
    finally:
        for proc in procs:
            _stop(proc)
    return 0


async def _serve(config: Any) -> None:
    from gateway.app import make_app
    from gateway.serve import serve

    url = f"http://{config.listen.host}:{config.listen.port}{config.listen.path}"

    async def walkthrough() -> None:
        print(f"\ntaskgate is listening on {url}, in front of:")
        for replica in config.backends["reports"].replicas:
            print(f"  {replica}")
        await _show(url)
        print(_EXAMPLE.format(url=url))
        print("Press Ctrl-C to stop taskgate and both replicas.", flush=True)

    await serve(make_app(config), config.listen.host, config.listen.port, on_ready=walkthrough)


async def _show(url: str) -> None:
    """A few requests through taskgate, printed as the wire shows them."""
    async with aiohttp.ClientSession() as session:
        steps: list[tuple[str, dict[str, Any]]] = [
            ("server/discover", {}),
            ("tools/list", {}),
            ("tools/call", {"name": "whoami", "arguments": {}}),
            ("tools/call", {"name": "whoami", "arguments": {}}),
        ]
        for number, (method, params) in enumerate(steps, start=1):
            answer = await _post(session, url, number, method, params)
            print(f"\n> {method} {orjson.dumps(params).decode()}\n< {_summary(method, answer)}")


async def _post(
    session: aiohttp.ClientSession, url: str, request_id: int, method: str, params: dict[str, Any]
) -> Any:
    meta = {
        PROTOCOL_VERSION_KEY: "2026-07-28",
        CLIENT_CAPABILITIES_KEY: {"extensions": {TASKS_EXTENSION: {}}},
    }
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": method,
        "params": {**params, "_meta": meta},
    }
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": method,
    }
    if "name" in params:
        headers["Mcp-Name"] = params["name"]
    async with session.post(url, data=orjson.dumps(body), headers=headers) as response:
        return orjson.loads(await response.read())


def _summary(method: str, answer: Any) -> str:
    result = answer.get("result") if isinstance(answer, dict) else None
    if not isinstance(result, dict):
        return orjson.dumps(answer).decode()
    if method == "server/discover":
        keys = sorted(result.get("capabilities", {}).get("extensions", {}))
        return f"versions {result.get('supportedVersions')}, extensions {keys}"
    if method == "tools/list":
        return "tools " + ", ".join(tool["name"] for tool in result.get("tools", []))
    return orjson.dumps(result.get("structuredContent", result)).decode()


_EXAMPLE = """
Try it yourself (2026-07-28 is stateless: every request carries its own _meta):

  curl -s {url} -H 'Content-Type: application/json' \\
    -H 'Accept: application/json, text/event-stream' \\
    -H 'MCP-Protocol-Version: 2026-07-28' -H 'Mcp-Method: tools/call' -H 'Mcp-Name: echo' \\
    -d '{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo",
         "arguments":{{"text":"hello"}},"_meta":{{
         "io.modelcontextprotocol/protocolVersion":"2026-07-28",
         "io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}'

or with the FastMCP client (python, from this checkout's .venv):

  import asyncio, fastmcp
  async def main():
      async with fastmcp.Client("{url}") as client:
          print(await client.call_tool("echo", {{"text": "hello"}}))
  asyncio.run(main())
"""


def _start_backend(url: str, name: str) -> subprocess.Popen[bytes]:
    port = url.rsplit(":", 1)[1].split("/", 1)[0]
    return subprocess.Popen(
        [sys.executable, "-m", "backends.report", "--port", port, "--replica", name],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        # Ctrl-C goes to taskgate alone, which then stops the replicas in order.
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _await_ready(proc: subprocess.Popen[bytes], url: str) -> None:
    stdout: IO[bytes] | None = proc.stdout
    assert stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        line = stdout.readline()
        if not line:
            raise SystemExit(f"the demo backend for {url} exited (is the port in use?)")
        if line.startswith(b"READY "):
            return
    raise SystemExit(f"the demo backend for {url} did not start in {READY_TIMEOUT_S:g} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    with contextlib.suppress(Exception):
        if proc.stdout is not None:
            proc.stdout.close()
