"""`taskgate demo`: two replicas of the report backend behind taskgate, on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
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

ROOT = Path(__file__).resolve().parents[2]  # the checkout: gateway/process/demo.py
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
    except OSError as exc:
        # One line, as `taskgate run` says it: a port in use is the usual cause.
        where = f"{config.listen.host}:{config.listen.port}"
        print(f"taskgate demo: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
        print("  pick another port: taskgate demo --port N (make demo PORT=N)", file=sys.stderr)
        return 1
    finally:
        for proc in procs:
            _stop(proc)
    return 0


async def _serve(config: Any) -> None:
    from gateway.process.serve import running, until_stopped

    async with running(config) as process:
        url = process.url

        async def walkthrough() -> None:
            print(f"\ntaskgate is listening on {url}, in front of:")
            for replica in config.backends["reports"].replicas:
                print(f"  {replica}")
            await _show(url)
            print(_EXAMPLE.format(url=url))
            if process.admin_url is not None:
                print(f"Status page: {process.admin_url}/  (metrics: {process.admin_url}/metrics)")
            print("Press Ctrl-C to stop taskgate and both replicas.", flush=True)

        await until_stopped(process, on_ready=walkthrough)


async def _show(url: str) -> None:
    """A few requests through taskgate, printed as the wire shows them, then a whole task."""
    async with aiohttp.ClientSession() as session:
        steps: list[tuple[str, dict[str, Any]]] = [
            ("server/discover", {}),
            ("tools/list", {}),
            ("tools/call", {"name": "whoami", "arguments": {}}),
            ("tools/call", {"name": "whoami", "arguments": {}}),
        ]
        for method, params in steps:
            answer = await _post(session, url, method, params)
            print(f"\n> {method} {orjson.dumps(params).decode()}\n< {_summary(method, answer)}")
        await _show_task(session, url)


async def _show_task(session: aiohttp.ClientSession, url: str) -> None:
    """generate_report as a task: created, polled, answered through tasks/update, completed."""
    print("\nA task through taskgate (each replica keeps its tasks in its own memory):")
    created = await _post(
        session, url, "tools/call", {"name": "generate_report", "arguments": {"size": "small"}}
    )
    task_id = created["result"]["taskId"]
    print(f"> tools/call generate_report  < resultType task, taskId {task_id[:8]}...")
    task = await _poll(session, url, task_id, {"input_required"})
    key, request = next(iter(task["inputRequests"].items()))
    print(f"> tasks/get  < input_required: {request['params']['message']!r}")
    answer = {"action": "accept", "content": {"approved": True}}
    await _post(session, url, "tasks/update", {"taskId": task_id, "inputResponses": {key: answer}})
    print("> tasks/update approved: true  < resultType complete")
    task = await _poll(session, url, task_id, {"completed", "failed", "cancelled"})
    content = task.get("result", {}).get("structuredContent")
    print(f"> tasks/get  < {task['status']}: {orjson.dumps(content).decode()}")


async def _poll(
    session: aiohttp.ClientSession, url: str, task_id: str, statuses: set[str]
) -> dict[str, Any]:
    for _ in range(150):  # 30 s at most
        answer = await _post(session, url, "tasks/get", {"taskId": task_id})
        task: dict[str, Any] = answer["result"]
        if task["status"] in statuses:
            return task
        await asyncio.sleep(0.2)
    raise SystemExit(f"the demo task did not reach {sorted(statuses)} in 30 s")


_ids = itertools.count(1)


async def _post(
    session: aiohttp.ClientSession, url: str, method: str, params: dict[str, Any]
) -> Any:
    meta = {
        PROTOCOL_VERSION_KEY: "2026-07-28",
        CLIENT_CAPABILITIES_KEY: {"extensions": {TASKS_EXTENSION: {}}},
    }
    body = {
        "jsonrpc": "2.0",
        "id": next(_ids),
        "method": method,
        "params": {**params, "_meta": meta},
    }
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": method,
    }
    name = params.get("name", params.get("taskId"))
    if name is not None:
        headers["Mcp-Name"] = name
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

or with the FastMCP client, which drives the task and its question (from this .venv):

  import asyncio, fastmcp, fastmcp_tasks  # importing fastmcp_tasks turns on task support

  async def approve(message, response_type, params, context):
      print("asked:", message)
      return {{"approved": True}}

  async def main():
      async with fastmcp.Client("{url}", elicitation_handler=approve) as client:
          result = await client.call_tool("generate_report", {{"size": "small"}})
          print(result.structured_content)

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
