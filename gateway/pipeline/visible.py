"""Which route serves an item for a caller, answered as invariant 7 asks: an item no visible
route exposes, or that its backend does not list, answers exactly like one that exists nowhere.
Shared by both eras' handlers (gateway/pipeline/modern.py, gateway/pipeline/legacy.py)."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from gateway.auth import Principal
from gateway.auth.metadata import challenge
from gateway.catalog.table import Route
from gateway.errors import (
    GatewayError,
    InBandError,
    InsufficientScope,
    ResourceNotFound,
    TaskNotFound,
    UnknownPrompt,
    UnknownTool,
)
from gateway.h1.request import DownstreamResponse, Reply
from gateway.observe.access import task_hash
from gateway.observe.exchange import Exchange
from gateway.pipeline.replies import failed
from gateway.pipeline.state import Gateway
from gateway.protocol.codes import Code, RequestId
from gateway.protocol.envelope import RPCRequest

JSON = "application/json"

log = logging.getLogger("taskgate.handler")


async def tool_route(
    gateway: Gateway, tool: str, principal: Principal, request_id: RequestId
) -> Route:
    """The route of a tool this caller may see and its backend lists, or UnknownTool."""
    route = gateway.routes.lookup(tool, principal.tenant)
    if route is None or await gateway.catalog.knows(route.backend, tool) is False:
        raise UnknownTool(tool, request_id=request_id)
    return route


async def prompt_route(
    gateway: Gateway, prompt: str, principal: Principal, request_id: RequestId
) -> Route:
    """The route of a prompt, as a tool's, or UnknownPrompt."""
    route = gateway.routes.lookup_prompt(prompt, principal.tenant)
    if route is None or await gateway.catalog.knows_prompt(route.backend, prompt) is False:
        raise UnknownPrompt(prompt, request_id=request_id)
    return route


async def uri_route(
    gateway: Gateway, uri: str, principal: Principal, request_id: RequestId
) -> Route:
    """A route naming the URI (exact or glob) whose backend lists it; else the first visible
    route with a template that could produce it, whose backend lists that template; else
    ResourceNotFound."""
    route = await gateway.catalog.resource_route(uri, principal.tenant)
    if route is None:
        raise ResourceNotFound(uri, request_id=request_id)
    return route


async def completion_route(
    gateway: Gateway, message: RPCRequest, principal: Principal
) -> tuple[Route, str]:
    """The route of completion/complete's params.ref (a prompt by name, a resource template by
    its exact uriTemplate) and the kind of item, answered as prompts/get or resources/read of
    it would be when no visible route exposes it."""
    given = message.params.get("ref")
    ref: dict[str, Any] = given if isinstance(given, dict) else {}
    kind = ref.get("type")
    catalog = gateway.catalog
    tenant = principal.tenant
    if kind == "ref/prompt" and isinstance(name := ref.get("name"), str):
        route = gateway.routes.lookup_prompt(name, tenant)
        if route is None or await catalog.knows_prompt(route.backend, name) is False:
            raise UnknownPrompt(name, request_id=message.id)
        return route, "prompt"
    if kind == "ref/resource" and isinstance(uri := ref.get("uri"), str):
        route = gateway.routes.lookup_template(uri, tenant)
        if route is None or await catalog.knows_template(route.backend, uri) is False:
            raise ResourceNotFound(uri, request_id=message.id)
        return route, "resource"
    raise InBandError(
        "Invalid params: params.ref must be a prompt or resource reference",
        request_id=message.id,
        code=Code.INVALID_PARAMS,
    )


def check_scopes(
    gateway: Gateway, principal: Principal, route: Route, item: str, request_id: RequestId
) -> None:
    """Tenants decide what is visible; scopes decide what a visible item lets the token do."""
    if not principal.scopes.issuperset(route.scopes):
        www = challenge(gateway.auth.metadata_url, error="insufficient_scope", scopes=route.scopes)
        raise InsufficientScope(route.scopes, www, request_id, item=item)


def required_name(name: object, message: RPCRequest, param: str = "name") -> str:
    if not isinstance(name, str):
        raise InBandError(
            f"Invalid params: params.{param} must be a string",
            request_id=message.id,
            code=Code.INVALID_PARAMS,
        )
    return name


def normalised_not_found(reply: Reply, message: RPCRequest, uri: str) -> Reply:
    """The backend's own not-found for this URI (FastMCP: HTTP 400, -32602 "Resource not
    found: '<uri>'", data.uri) becomes taskgate's, so that a routed URI the backend refuses
    answers exactly like one no route exposes."""
    error = backend_error(reply, message)
    if (
        error is not None
        and error.get("code") == Code.INVALID_PARAMS
        and isinstance(error.get("data"), dict)
        and error["data"].get("uri") == uri
    ):
        return error_response(ResourceNotFound(uri, request_id=message.id))
    return reply


def normalised_unknown_prompt(reply: Reply, message: RPCRequest, name: str) -> Reply:
    """The backend's own unknown-prompt (FastMCP: HTTP 400, -32602 "Unknown prompt: '<name>'",
    no data), for a prompt taskgate's catalogue still lists, becomes taskgate's. Only those two
    exact messages: a -32602 about the prompt's arguments is the backend's answer, relayed."""
    error = backend_error(reply, message)
    if (
        error is not None
        and error.get("code") == Code.INVALID_PARAMS
        and error.get("message") in (f"Unknown prompt: {name}", f"Unknown prompt: {name!r}")
    ):
        return error_response(UnknownPrompt(name, request_id=message.id))
    return reply


def backend_error(reply: Reply, message: RPCRequest) -> dict[str, Any] | None:
    """The error object of a backend's whole JSON answer to `message`, or None (a result, a
    stream, or a body that is not a JSON-RPC answer to this id)."""
    if not isinstance(reply, DownstreamResponse) or reply.content_type != JSON:
        return None
    # find, not `in`, on the hot path: see gateway/protocol/era.py, is_modern
    if reply.status == 200 and reply.body.find(b'"error"') < 0:
        return None
    try:
        answer = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(answer, dict) or answer.get("id") != message.id:
        return None
    error = answer.get("error")
    return error if isinstance(error, dict) else None


def error_response(exc: GatewayError) -> DownstreamResponse:
    """taskgate's answer for a GatewayError: its status, body and headers."""
    return DownstreamResponse(
        status=exc.status, body=exc.body(), content_type=JSON, headers=exc.headers
    )


def owner_forgot(
    gateway: Gateway, reply: Reply, message: RPCRequest, task_id: str, seen: Exchange
) -> Reply:
    """The owner's own "not found" (it lost the task, e.g. on restart: FastMCP answers HTTP 400
    "Task <id> not found") becomes the one answer of a task that does not exist (docs/tasks.md). The
    operator still tells it from a lost route: the request log names the replica that answered
    (a route taskgate lost never reaches one), and taskgate_task_routes_total counts it as
    owner_lost (docs/decisions.md, 31)."""
    error = backend_error(reply, message)
    if error is None or error.get("code") != Code.INVALID_PARAMS:
        return reply
    text = error.get("message")
    if not isinstance(text, str) or "not found" not in text.lower() or "task" not in text.lower():
        return reply
    gateway.tasks.outcomes["owner_lost"] += 1
    log.info(
        "replica %s of %s no longer knows task %s; answered as an unknown task",
        seen.replica,
        seen.backend,
        task_hash(task_id),
    )
    return failed(seen, TaskNotFound(message.id))
