"""Raw MCP 2026-07-28 JSON-RPC over HTTP for tests: one message per POST."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple, TypeVar

import aiohttp
import orjson
from multidict import CIMultiDict

PROTOCOL_VERSION = "2026-07-28"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})

JsonObject = dict[str, Any]
T = TypeVar("T")


def request_meta(*, tasks: bool = True) -> JsonObject:
    """The per-request envelope a stateless client puts in `params._meta`."""
    extensions: JsonObject = {TASKS_EXTENSION: {}} if tasks else {}
    capabilities: JsonObject = {"extensions": extensions} if tasks else {}
    return {META_VERSION: PROTOCOL_VERSION, META_CAPABILITIES: capabilities}


def routing_name(method: str, params: Mapping[str, Any]) -> str | None:
    """The body field mirrored into `Mcp-Name` (SEP-2243; taskId for tasks/*)."""
    if method.startswith("tasks/"):
        return _str_or_none(params.get("taskId"))
    if method in ("tools/call", "prompts/get"):
        return _str_or_none(params.get("name"))
    if method == "resources/read":
        return _str_or_none(params.get("uri"))
    return None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def mcp_headers(method: str, params: Mapping[str, Any]) -> dict[str, str]:
    """The HTTP headers a 2026-07-28 client sends with one request."""
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": PROTOCOL_VERSION,
        "Mcp-Method": method,
    }
    name = routing_name(method, params)
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


def build_request(
    method: str, params: Mapping[str, Any] | None, *, id: int | str, tasks: bool = True
) -> JsonObject:
    """A JSON-RPC request whose `_meta` carries the envelope (caller keys win)."""
    body_params: JsonObject = dict(params or {})
    body_params["_meta"] = {**request_meta(tasks=tasks), **body_params.get("_meta", {})}
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": body_params}


class Answer(NamedTuple):
    """One HTTP answer as it arrived: status, headers (case-insensitive) and the body's bytes."""

    status: int
    headers: CIMultiDict[str]
    raw: bytes

    @property
    def message(self) -> JsonObject:
        message: JsonObject = orjson.loads(self.raw)
        return message


async def post_raw(
    http: aiohttp.ClientSession,
    url: str,
    body: bytes | Mapping[str, Any],
    *,
    headers: Mapping[str, str] | None = None,
    drop: tuple[str, ...] = (),
) -> Answer:
    """POST bytes as they are, or a request object with the MCP headers derived from it;
    `headers` add to or replace those, `drop` removes some, for negative cases."""
    if isinstance(body, bytes):
        sent = {"Content-Type": "application/json", **(headers or {})}
        data = body
    else:
        sent = {**mcp_headers(body["method"], body.get("params", {})), **(headers or {})}
        data = orjson.dumps(body)
    for key in drop:
        sent.pop(key, None)
    async with http.post(url, data=data, headers=sent) as response:
        return Answer(response.status, CIMultiDict(response.headers), await response.read())


_call_ids = itertools.count(900_000)


async def mcp_call(
    session: aiohttp.ClientSession,
    url: str,
    method: str,
    params: dict[str, Any] | None = None,
    *,
    token: str | None = None,
    id: int | None = None,
    drop: tuple[str, ...] = (),
) -> Answer:
    """`method` as a client holding `token` sends it, every MCP header included (`drop` names
    headers to leave out); a fresh id unless one is given."""
    body = build_request(method, params or {}, id=next(_call_ids) if id is None else id)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return await post_raw(session, url, body, headers=headers, drop=drop)


def parse_sse(text: str) -> list[JsonObject]:
    """The JSON messages of an SSE body, in order."""
    messages: list[JsonObject] = []
    for event in text.replace("\r\n", "\n").split("\n\n"):
        data = [line[5:].lstrip() for line in event.split("\n") if line.startswith("data:")]
        if data:
            messages.append(json.loads("\n".join(data)))
    return messages


async def mcp_exchange(
    session: aiohttp.ClientSession,
    url: str,
    method: str,
    params: Mapping[str, Any] | None = None,
    *,
    id: int | str,
    tasks: bool = True,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, list[JsonObject]]:
    """POST one request; return the status and every message (SSE or JSON) back."""
    body = build_request(method, params, id=id, tasks=tasks)
    sent = {**mcp_headers(method, body["params"]), **(headers or {})}
    async with session.post(url, json=body, headers=sent) as resp:
        text = await resp.text()
        if resp.content_type == "text/event-stream":
            return resp.status, parse_sse(text)
        return resp.status, [json.loads(text)] if text else []


async def mcp_post(
    session: aiohttp.ClientSession,
    url: str,
    method: str,
    params: Mapping[str, Any] | None = None,
    *,
    id: int | str,
    tasks: bool = True,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, JsonObject]:
    """POST one request; return the status and its JSON-RPC response message."""
    status, messages = await mcp_exchange(
        session, url, method, params, id=id, tasks=tasks, headers=headers
    )
    responses = [m for m in messages if m.get("id") == id and "method" not in m]
    if len(responses) != 1:
        raise AssertionError(f"expected one response to id {id!r}, got {messages!r}")
    return status, responses[0]


def result_of(response: JsonObject) -> JsonObject:
    """The `result` of a JSON-RPC response, failing loudly on an error."""
    if "result" not in response:
        raise AssertionError(f"expected a result, got {response!r}")
    result: JsonObject = response["result"]
    return result


async def poll_until(
    probe: Callable[[], Awaitable[T]],
    done: Callable[[T], bool],
    *,
    within: float = 15.0,
    interval: float = 0.05,
) -> T:
    """Call `probe` until `done` holds, within `within` seconds; return that value."""
    async with asyncio.timeout(within):
        while True:
            value = await probe()
            if done(value):
                return value
            await asyncio.sleep(interval)


async def wait_for_task_status(
    session: aiohttp.ClientSession,
    url: str,
    task_id: str,
    statuses: frozenset[str] | set[str],
    *,
    within: float = 15.0,
) -> JsonObject:
    """Poll `tasks/get` until the task reaches one of `statuses`; return that result."""
    counter = iter(range(1_000_000, 2_000_000))

    async def probe() -> JsonObject:
        _, response = await mcp_post(
            session, url, "tasks/get", {"taskId": task_id}, id=next(counter)
        )
        return result_of(response)

    return await poll_until(probe, lambda task: task.get("status") in statuses, within=within)
