"""A 2025-era client on the raw wire (aiohttp): initialize, then requests with Mcp-Session-Id,
answers read from JSON or from an event stream, the client's own answers POSTed, DELETE."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from tests.support.mcp import JsonObject, parse_sse

ACCEPT = "application/json, text/event-stream"
SESSION = "Mcp-Session-Id"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    messages: list[JsonObject]  # every JSON-RPC message of the body, in order
    text: str

    @property
    def last(self) -> JsonObject:
        assert self.messages, f"HTTP {self.status}, no JSON-RPC message: {self.text[:300]}"
        return self.messages[-1]

    @property
    def result(self) -> JsonObject:
        last = self.last
        assert "result" in last, f"not a result: {last}"
        result: JsonObject = last["result"]
        return result

    @property
    def error(self) -> JsonObject:
        last = self.last
        assert "error" in last, f"not an error: {last}"
        error: JsonObject = last["error"]
        return error


@dataclass
class LegacyClient:
    http: aiohttp.ClientSession
    url: str
    token: str | None = None
    version: str = "2025-11-25"
    session_id: str | None = None
    capabilities: JsonObject = field(default_factory=lambda: {"elicitation": {}})
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def headers(self, *, session: bool = True) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": ACCEPT}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        if session and self.session_id is not None:
            headers[SESSION] = self.session_id
            if self.version != "2025-03-26":
                headers["MCP-Protocol-Version"] = self.version
        return headers

    async def initialize(self, version: str | None = None) -> Answer:
        answer = await self.post(
            {
                "jsonrpc": "2.0",
                "id": next(self._ids),
                "method": "initialize",
                "params": {
                    "protocolVersion": version or self.version,
                    "capabilities": self.capabilities,
                    "clientInfo": {"name": "raw-legacy", "version": "1"},
                },
            },
            session=False,
        )
        if answer.status == 200:
            self.session_id = answer.headers[SESSION]
            self.version = answer.result["protocolVersion"]
            initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            done = await self.post(initialized)
            assert done.status == 202, done.text
        return answer

    async def request(self, method: str, params: JsonObject | None = None) -> Answer:
        message: JsonObject = {"jsonrpc": "2.0", "id": next(self._ids), "method": method}
        if params is not None:
            message["params"] = params
        return await self.post(message)

    async def post(self, message: Any, *, session: bool = True) -> Answer:
        async with self.http.post(
            self.url, data=orjson.dumps(message), headers=self.headers(session=session)
        ) as response:
            text = await response.text()
            return Answer(response.status, dict(response.headers), _messages(response, text), text)

    async def delete(self) -> int:
        async with self.http.delete(self.url, headers=self.headers()) as response:
            await response.read()
            return response.status


def _messages(response: aiohttp.ClientResponse, text: str) -> list[JsonObject]:
    content_type = response.headers.get("Content-Type", "")
    if content_type.startswith("text/event-stream"):
        return parse_sse(text)
    if not text:
        return []
    value = orjson.loads(text)
    return value if isinstance(value, list) else [value]
