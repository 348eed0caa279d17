"""Discovery reads every page of prompts/list, resources/list and resources/templates/list from a
backend that advertises them, and a list that fails costs the backend nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.catalog.discovery import Catalog
from gateway.catalog.table import RouteTable
from gateway.config import BackendConfig, Config, RouteConfig
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend
from tests.support.gateway import serving

# cursor -> (prompts on that page, nextCursor or None when the list ends)
PROMPT_PAGES: dict[str | None, tuple[list[str], str | None]] = {
    None: (["first"], ""),
    "": (["second"], "third-page"),
    "third-page": (["third"], None),
}


def prompt(name: str) -> dict[str, Any]:
    # Unusual but valid content: the catalogue keeps the object as the backend sent it.
    return {
        "name": name,
        "title": f"Prompt «{name}»",
        "arguments": [{"name": "topic", "required": True}],
        "_meta": {"example.com/order": [3, 1, 2], "zeta": None, "alpha": 1.5},
    }


RESOURCE = {"uri": "data://acme/report", "name": "report", "mimeType": "text/plain"}
TEMPLATE = {"uriTemplate": "data://acme/{id}", "name": "by id"}


@dataclass
class Upstream:
    """A backend answering discovery from tables, recording what it was asked."""

    capabilities: dict[str, Any]
    failing: set[str] = field(default_factory=set)  # list methods that answer an error
    asked: list[tuple[str, str | None]] = field(default_factory=list)  # (method, cursor)
    # server/discover is answered only once this method has been asked too (an error when it
    # is not asked within a few seconds): how a test sees two requests in flight at once.
    discover_waits_for: str | None = None
    arrived: dict[str, asyncio.Event] = field(default_factory=dict)

    async def handle(self, request: web.Request) -> web.Response:
        message = await request.json()
        method, params = message["method"], message.get("params") or {}
        self.asked.append((method, params.get("cursor")))
        self.arrived.setdefault(method, asyncio.Event()).set()
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
        if method == "server/discover" and self.discover_waits_for is not None:
            other = self.arrived.setdefault(self.discover_waits_for, asyncio.Event())
            try:
                await asyncio.wait_for(other.wait(), 3.0)
            except TimeoutError:
                body["error"] = {"code": -32603, "message": f"{self.discover_waits_for} not asked"}
                return web.Response(body=orjson.dumps(body), content_type="application/json")
        if method in self.failing:
            body["error"] = {"code": -32603, "message": "the list is broken today"}
            return web.Response(body=orjson.dumps(body), content_type="application/json")
        result: dict[str, Any] = {"resultType": "complete"}
        if method == "server/discover":
            result |= {"supportedVersions": ["2026-07-28"], "capabilities": self.capabilities}
        elif method == "tools/list":
            result["tools"] = [{"name": "echo", "inputSchema": {"type": "object"}}]
        elif method == "prompts/list":
            names, next_cursor = PROMPT_PAGES[params.get("cursor")]
            result["prompts"] = [prompt(name) for name in names]
            if next_cursor is not None:
                result["nextCursor"] = next_cursor
        elif method == "resources/list":
            result["resources"] = [RESOURCE]
        elif method == "resources/templates/list":
            result["resourceTemplates"] = [TEMPLATE]
        body["result"] = result
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    def methods(self) -> set[str]:
        return {method for method, _ in self.asked}


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Upstream, str]]:
    backend = Upstream(capabilities={"tools": {}, "prompts": {}, "resources": {}})
    app = web.Application()
    app.router.add_post("/mcp", backend.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield backend, str(server.make_url("/mcp"))
    finally:
        await server.close()


def lists_config(url: str) -> Config:
    return Config.model_validate(
        {
            "listen": {"host": "127.0.0.1", "port": 0},
            "store": {"url": "sqlite:///:memory:"},
            "backends": {"up": {"replicas": [url]}},
            "routes": [
                {
                    "backend": "up",
                    "tools": ["*"],
                    "prompts": ["*"],
                    "resources": ["data://acme/*"],
                    "resource_templates": ["data://acme/{id}"],
                }
            ],
        }
    )


async def test_every_page_of_prompts_list_is_read_and_each_item_kept_as_sent(
    upstream: tuple[Upstream, str],
) -> None:
    backend, url = upstream
    async with serving(lists_config(url)) as gateway:
        catalog = gateway.state.catalog
        prompts = await catalog.prompts_result("acme")
        resources = await catalog.resources_result("acme")
        templates = await catalog.templates_result("acme")
    sent = [prompt(name) for name in ("first", "second", "third")]
    assert orjson.dumps(prompts["prompts"]) == orjson.dumps(sent)
    assert prompts["cacheScope"] == "private"
    assert "nextCursor" not in prompts
    assert resources["resources"] == [RESOURCE]
    assert templates["resourceTemplates"] == [TEMPLATE]
    cursors = [cursor for method, cursor in backend.asked if method == "prompts/list"]
    assert cursors[:3] == [None, "", "third-page"]  # "" is a cursor, not the end


async def test_a_backend_that_does_not_advertise_a_list_is_not_asked_for_it(
    upstream: tuple[Upstream, str],
) -> None:
    backend, url = upstream
    backend.capabilities = {"tools": {}}
    async with serving(lists_config(url)) as gateway:
        catalog = gateway.state.catalog
        assert (await catalog.prompts_result("acme"))["prompts"] == []
        assert (await catalog.resources_result("acme"))["resources"] == []
        assert not await catalog.serves("prompts")
        assert not await catalog.serves("resources")
    assert backend.methods() == {"server/discover", "tools/list"}


async def test_a_failing_list_keeps_the_backend_and_the_items_last_seen(
    upstream: tuple[Upstream, str], pool: Pool
) -> None:
    backend, url = upstream
    backends = {"up": Backend.from_config("up", BackendConfig(replicas=(url,)))}
    table = RouteTable((RouteConfig(backend="up", tools=("*",), resources=("data://acme/*",)),))
    catalog = Catalog(pool, backends, table, refresh_s=3600, min_retry_s=0)
    try:
        backend.failing = {"resources/list"}
        assert await catalog.knows("up", "echo") is True  # the backend is known all the same
        assert await catalog.knows_prompt("up", "first") is True
        assert await catalog.knows_resource("up", RESOURCE["uri"]) is False  # never seen yet

        backend.failing = set()
        assert await catalog.knows_resource("up", RESOURCE["uri"]) is True
        backend.failing = {"resources/list"}
        # A miss forces a fresh look, in which resources/list fails: the last items stay.
        assert await catalog.knows_resource("up", "data://acme/other") is False
        assert (await catalog.resources_result("acme"))["resources"] == [RESOURCE]
        assert backend.asked.count(("resources/list", None)) == 4
    finally:
        await catalog.close()


async def test_a_refresh_asks_the_lists_last_advertised_with_discover_and_follows_a_change(
    upstream: tuple[Upstream, str], pool: Pool
) -> None:
    backend, url = upstream
    backend.capabilities = {"tools": {}, "prompts": {}}
    up = Backend.from_config("up", BackendConfig(replicas=(url,)))
    table = RouteTable(
        (RouteConfig(backend="up", tools=("*",), prompts=("*",), resources=("data://acme/*",)),)
    )
    catalog = Catalog(pool, {"up": up}, table, refresh_s=3600, min_retry_s=0)
    try:
        assert await catalog.knows_prompt("up", "first") is True
        # One round trip, not one after another: discover is answered only once prompts/list
        # (which the last discover advertised) is in flight beside it.
        backend.discover_waits_for = "prompts/list"
        backend.capabilities = {"tools": {}, "resources": {}}
        backend.asked.clear()
        backend.arrived.clear()
        view = await catalog.refresh_from("up", up.replicas[0])
        assert view is not None
        assert view.prompts == {}, "a list no longer advertised is dropped"
        assert list(view.resources) == [RESOURCE["uri"]], "a list newly advertised is read after"
        assert backend.methods() == {
            "server/discover",
            "tools/list",
            "prompts/list",
            "resources/list",
            "resources/templates/list",
        }
    finally:
        await catalog.close()
