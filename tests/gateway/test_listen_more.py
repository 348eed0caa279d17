"""subscriptions/listen beyond one stream: list_changed per tenant from a backend that changes
while it runs, a listen on one taskgate instance following tasks created through another
(one Redis store), and the graceful end on SIGTERM of `taskgate run` (issue 13)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.gateway.conftest import REPORT_TOOLS
from tests.gateway.test_cli import read_until, taskgate
from tests.gateway.test_listen import WITHIN, create_task, task_get
from tests.support.gateway import gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.listen import (
    SERVER_INFO_META,
    ListenStream,
    listening,
    next_event,
    subscription_id,
)
from tests.support.mcp import mcp_call, mcp_post, result_of
from tests.support.procs import BackendProcess, free_ports
from tests.support.tasks import APPROVE


@pytest.fixture
def lister() -> Iterator[BackendProcess]:
    """A replica of its own: these tests change what it serves."""
    with BackendProcess("lister") as backend:
        yield backend


async def set_visible(
    http: aiohttp.ClientSession, backend: BackendProcess, kind: str, name: str, on: bool
) -> None:
    arguments = {"kind": kind, "name": name, "on": on}
    answer = await mcp_call(
        http, backend.url, "tools/call", {"name": "set_visible", "arguments": arguments}
    )
    assert answer.status == 200, answer.raw


async def next_method(stream: ListenStream) -> str:
    event = await next_event(stream)
    return str(event["method"])


async def test_list_changed_reaches_only_the_tenants_that_see_the_change_once_each(
    http: aiohttp.ClientSession, issuer: Issuer, lister: BackendProcess
) -> None:
    routes: list[Any] = [
        {"prompts": ["report_greeting"], "backend": "lister", "tenants": ["acme"]},
        {"prompts": ["report_chart"], "tools": ["echo", "whoami"], "backend": "lister"},
    ]
    config = gateway_config(
        {"lister": [lister.url]},
        routes,
        auth=jwt_auth(issuer),
        discovery={"refresh_s": 0.1},
        subscriptions={"list_poll_s": 0.1},
    )
    flags = {"promptsListChanged": True, "toolsListChanged": True}
    # acme's prompt is not there yet: the backend adds it while the streams listen
    await set_visible(http, lister, "prompt", "report_greeting", False)
    async with (
        serving(config) as gateway,
        listening(http, gateway.url, flags, id="a", token=issuer.token("acme", "ann")) as acme,
        listening(http, gateway.url, flags, id=2, token=issuer.token("globex", "gil")) as globex,
    ):
        for stream in (acme, globex):
            ack = await next_event(stream)
            assert ack["params"]["notifications"] == flags
        # A prompt only acme's route shows is added: acme is told, globex is not.
        await set_visible(http, lister, "prompt", "report_greeting", True)
        event = await next_event(acme)
        assert event == {
            "jsonrpc": "2.0",
            "method": "notifications/prompts/list_changed",
            "params": {"_meta": {"io.modelcontextprotocol/subscriptionId": "a"}},
        }
        # A tool both see goes away: both are told, and it is globex's first event, so the
        # prompt change never reached it; acme gets no second prompts event either.
        await set_visible(http, lister, "tool", "whoami", False)
        assert await next_method(acme) == "notifications/tools/list_changed"
        event = await next_event(globex)
        assert event["method"] == "notifications/tools/list_changed"
        assert subscription_id(event) == 2
        # A change a list does not show (a tool no route names) moves nothing: the next events
        # are those of the change after it.
        await set_visible(http, lister, "tool", "stats", False)
        await set_visible(http, lister, "prompt", "report_chart", False)
        assert await next_method(acme) == "notifications/prompts/list_changed"
        assert await next_method(globex) == "notifications/prompts/list_changed"


async def test_a_listen_on_one_instance_follows_a_task_created_through_another(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    redis_url: str,
) -> None:
    def config() -> Any:
        return gateway_config(
            {"reports": [b.url for b in report_backends]},
            [(REPORT_TOOLS, "reports")],
            store=redis_url,
            auth=jwt_auth(issuer),
            subscriptions={"min_poll_interval_ms": 50, "default_poll_interval_ms": 100},
        )

    ann = issuer.token("acme", "ann")
    async with serving(config()) as a, serving(config()) as b:
        task = await create_task(http, a.url, ann)
        task_id = task["taskId"]
        async with listening(http, b.url, {"taskIds": [task_id]}, id=1, token=ann) as stream:
            ack = await next_event(stream)
            assert ack["params"]["notifications"] == {"taskIds": [task_id]}
            while True:
                event = await next_event(stream)
                status = event["params"]["status"]
                if status == "input_required":
                    (key,) = event["params"]["inputRequests"]
                    update = {"taskId": task_id, "inputResponses": {key: APPROVE}}
                    answer = await mcp_call(http, a.url, "tasks/update", update, token=ann)
                    assert answer.status == 200
                if status == "completed":
                    break
        final = await task_get(http, a.url, ann, task_id)
        assert final["status"] == "completed"


async def test_sigterm_gives_each_stream_the_listen_result_before_taskgate_exits(
    tmp_path: Path, report_backends: list[BackendProcess]
) -> None:
    (port,) = free_ports(1)
    replicas = ", ".join(f'"{b.url}"' for b in report_backends)
    config = tmp_path / "taskgate.yaml"
    config.write_text(
        f"listen: {{host: 127.0.0.1, port: {port}, drain_timeout_s: 10}}\n"
        f"store: {{url: 'sqlite:///{tmp_path}/routes.db'}}\n"
        f"backends:\n  reports: {{replicas: [{replicas}]}}\n"
        "routes:\n  - {tools: [whoami, generate_report], backend: reports}\n"
    )
    url = f"http://127.0.0.1:{port}/mcp"
    with taskgate("run", "--config", str(config)) as proc:
        read_until(proc, "listening on")
        async with aiohttp.ClientSession() as http:
            _, created = await mcp_post(
                http,
                url,
                "tools/call",
                {"name": "generate_report", "arguments": {"size": "s"}},
                id=1,
            )
            task_id = result_of(created)["taskId"]
            async with (
                listening(http, url, {"toolsListChanged": True}, id=10) as one,
                listening(http, url, {"taskIds": [task_id]}, id="two") as two,
            ):
                for stream in (one, two):
                    await next_event(stream)
                proc.send_signal(signal.SIGTERM)
                async with asyncio.timeout(WITHIN):
                    ends = [(await one.until_end())[-1], (await two.until_end())[-1]]
        assert ends == [
            {
                "jsonrpc": "2.0",
                "id": 10,
                "result": {
                    "resultType": "complete",
                    "_meta": {"io.modelcontextprotocol/subscriptionId": 10, **SERVER_INFO_META},
                },
            },
            {
                "jsonrpc": "2.0",
                "id": "two",
                "result": {
                    "resultType": "complete",
                    "_meta": {"io.modelcontextprotocol/subscriptionId": "two", **SERVER_INFO_META},
                },
            },
        ]
        assert proc.wait(timeout=15) == 0
