"""A subscriptions/listen client for tests: open the stream, read its events one at a time."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import aiohttp

from gateway import __version__
from gateway.protocol.sse import SSEDecoder
from tests.support.mcp import (
    JsonObject,
    build_request,
    mcp_call,
    mcp_headers,
    poll_until,
    result_of,
)
from tests.support.procs import BackendProcess

WITHIN = 20.0  # seconds any one expected event or condition may take

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
# What taskgate puts beside the subscriptionId in the listen's result.
SERVER_INFO_META = {
    "io.modelcontextprotocol/serverInfo": {"name": "taskgate", "version": __version__}
}


class ListenStream:
    """One open listen: the answer's status and headers, then its messages in order."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.status = response.status
        self.comments = 0  # SSE comments seen (keep-alives)
        self._decoder = SSEDecoder()
        self._messages: deque[JsonObject] = deque()
        self.ended = False  # the server closed the stream

    async def body(self) -> JsonObject:
        """The whole answer of a refused listen (not an event stream)."""
        answer: JsonObject = json.loads(await self.response.read())
        return answer

    async def next(self) -> JsonObject:
        """The next message; AssertionError if the stream ends first. Bounded by the caller's
        timeout (the tests wrap reads in asyncio.timeout)."""
        while not self._messages:
            chunk = await self.response.content.readany()
            if not chunk:
                self.ended = True
                raise AssertionError("the listen stream ended")
            for frame in self._decoder.feed(chunk):
                if frame.data is None:
                    self.comments += frame.raw.startswith(b":")
                    continue
                self._messages.append(json.loads(frame.data))
        return self._messages.popleft()

    async def comment(self) -> None:
        """Read until one more SSE comment arrives (messages read meanwhile are kept)."""
        seen = self.comments
        while self.comments == seen:
            chunk = await self.response.content.readany()
            if not chunk:
                raise AssertionError("the listen stream ended")
            for frame in self._decoder.feed(chunk):
                if frame.data is None:
                    self.comments += frame.raw.startswith(b":")
                else:
                    self._messages.append(json.loads(frame.data))

    async def until_end(self) -> list[JsonObject]:
        """Every message left, up to the end of the stream."""
        found: list[JsonObject] = []
        while True:
            try:
                found.append(await self.next())
            except AssertionError:
                return found


@asynccontextmanager
async def listening(
    http: aiohttp.ClientSession,
    url: str,
    notifications: Mapping[str, Any],
    *,
    id: int | str,
    token: str | None = None,
    tasks: bool = True,
) -> AsyncIterator[ListenStream]:
    """POST subscriptions/listen; the stream is closed (by the client) when the block ends."""
    body = build_request(
        "subscriptions/listen", {"notifications": dict(notifications)}, id=id, tasks=tasks
    )
    headers = mcp_headers("subscriptions/listen", body["params"])
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with http.post(url, json=body, headers=headers) as response:
        yield ListenStream(response)


def subscription_id(message: JsonObject) -> Any:
    """The subscriptionId a listen-stream message carries (params._meta, or result._meta)."""
    holder: JsonObject = message["params"] if "params" in message else message["result"]
    return holder["_meta"][SUBSCRIPTION_ID]


async def next_event(stream: ListenStream, within: float = WITHIN) -> JsonObject:
    """The stream's next message, within `within` seconds."""
    async with asyncio.timeout(within):
        return await stream.next()


async def replica_tool(
    http: aiohttp.ClientSession, replica: BackendProcess, name: str, **arguments: Any
) -> JsonObject:
    """A tool of one replica, called directly (not through taskgate): its structured result."""
    answer = await mcp_call(http, replica.url, "tools/call", {"name": name, "arguments": arguments})
    assert answer.status == 200, answer.raw
    result = result_of(answer.message)
    assert result["isError"] is False, result
    found: JsonObject = result["structuredContent"]
    return found


async def streams_become(
    http: aiohttp.ClientSession, replicas: Sequence[BackendProcess], count: int
) -> None:
    """Wait (bounded) until each MCPServer replica (backends/pushing.py) says it holds `count`
    listen streams: a replica sees a client leave a moment after the client closed."""
    for replica in replicas:
        await poll_until(
            partial(replica_tool, http, replica, "listeners"),
            lambda found: found["streams"] == count,
            within=WITHIN,
        )
