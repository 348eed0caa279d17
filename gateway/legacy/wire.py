"""The 2025-era wire, sans I/O: the messages of a legacy POST, the ids of server-to-client
requests namespaced per backend, and the legacy shape of taskgate's answers. Which era a body is
of: gateway/protocol/era.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.observe.exchange import Exchange
from gateway.protocol import envelope
from gateway.protocol.codes import Code, EnvelopeError, RequestId
from gateway.protocol.envelope import RPCNotification, RPCRequest
from gateway.protocol.era import LEGACY_VERSIONS
from gateway.upstream.relay import Rewriter

# The newest revision of the 2025 era is offered to a client asking another.
NEWEST = LEGACY_VERSIONS[-1]

# What taskgate's answers carry at 2026-07-28 and a 2025-era result does not have.
_MODERN_ONLY = ("resultType", "ttlMs", "cacheScope")
# A namespaced id: "taskgate/<backend>/<the backend's id as JSON>". Backend names hold no "/"
# (letters, digits, "_", ".", "-": gateway/config), so the first two separators are ours.
_NAMESPACE = "taskgate/"
_MAX_UPSTREAM_ID = 200  # an upstream id longer than this is relayed as a bounded string anyway
# Messages in one 2025-03-26 batch: each is served in turn within one request's slot.
MAX_BATCH = 64


@dataclass(frozen=True, slots=True)
class RPCAnswer:
    """A JSON-RPC response the client POSTs: its answer to a server-to-client request."""

    id: RequestId
    value: dict[str, Any]


LegacyMessage = RPCRequest | RPCNotification | RPCAnswer


def parse(body: bytes, *, max_depth: int) -> LegacyMessage | list[LegacyMessage]:
    """The messages of a legacy POST: one message, or a batch (2025-03-26) of them; EnvelopeError
    for anything else, naming what is wrong."""
    start = body.lstrip()[:1]
    if start == b"[":
        return _batch(body, max_depth)
    return _one(body, max_depth)


def _one(body: bytes, max_depth: int) -> LegacyMessage:
    try:
        return envelope.parse(body, max_depth=max_depth)
    except EnvelopeError as refused:
        if "may not POST a JSON-RPC response" not in refused.message:
            raise
    # A response: the client answering a server-to-client request. The envelope checked the
    # JSON and the version before it refused the shape; depth and repeated keys are checked here.
    value = orjson.loads(body)
    envelope.check_shape(body, value, max_depth, None)
    answer_id = value.get("id")
    if isinstance(answer_id, bool) or not isinstance(answer_id, str | int):
        raise EnvelopeError('Invalid request: a response needs the "id" it answers')
    if ("result" in value) == ("error" in value):
        raise EnvelopeError(
            'Invalid request: a response carries exactly one of "result" and "error"',
            request_id=answer_id,
        )
    return RPCAnswer(id=answer_id, value=value)


def _batch(body: bytes, max_depth: int) -> list[LegacyMessage]:
    try:
        items = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise EnvelopeError(f"Parse error: {exc}", code=Code.PARSE_ERROR) from None
    if not isinstance(items, list) or not items:
        raise EnvelopeError("Invalid request: a batch must be a non-empty array")
    if len(items) > MAX_BATCH:
        raise EnvelopeError(f"Invalid request: a batch holds at most {MAX_BATCH} messages")
    # Each member is checked as if it came alone (depth, repeated keys): its own bytes.
    return [_one(orjson.dumps(item), max_depth - 1) for item in items]


def namespaced(backend: str, upstream_id: RequestId) -> str:
    """The id a backend's request to the client travels under: unique per backend, so two
    backends asking with the same id never collide, and readable on any instance."""
    encoded = orjson.dumps(upstream_id).decode()
    return f"{_NAMESPACE}{backend}/{encoded[:_MAX_UPSTREAM_ID]}"


def denamespaced(client_id: RequestId) -> tuple[str, RequestId] | None:
    """(backend, the backend's own id) of a namespaced id; None for an id taskgate never sent."""
    if not isinstance(client_id, str) or not client_id.startswith(_NAMESPACE):
        return None
    backend, slash, encoded = client_id[len(_NAMESPACE) :].partition("/")
    if not slash or not backend:
        return None
    try:
        upstream_id = orjson.loads(encoded)
    except orjson.JSONDecodeError:
        return None
    if isinstance(upstream_id, bool) or not isinstance(upstream_id, str | int):
        return None
    return backend, upstream_id


def rewrite_request(data: bytes, backend: str) -> bytes:
    """One message of an upstream stream as the client gets it: a request from the backend
    under a namespaced id; anything else (notifications, the answer) as it came."""
    if b'"method"' not in data or b'"id"' not in data:
        return data
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return data
    upstream_id = message["id"]
    if isinstance(upstream_id, bool) or not isinstance(upstream_id, str | int):
        return data
    message["id"] = namespaced(backend, upstream_id)
    return orjson.dumps(message)


def answer_upstream(answer: RPCAnswer, upstream_id: RequestId) -> bytes:
    """The client's answer as the backend that asked gets it: under the backend's own id."""
    return orjson.dumps({**answer.value, "id": upstream_id})


def without_task(message: RPCRequest) -> bytes:
    """A tools/call's body without a legacy `params.task` (taskgate serves no legacy tasks, and
    the revision says a task request to a server that does not is served as a plain call)."""
    if "task" not in message.params:
        return message.body
    value = orjson.loads(message.body)
    value["params"].pop("task", None)
    return orjson.dumps(value)


def legacy_result(result: dict[str, Any]) -> dict[str, Any]:
    """One of taskgate's list results in the 2025-era shape: no resultType, ttlMs or cacheScope
    (2026-07-28 fields), and no `_meta` of taskgate's own."""
    shaped = {key: value for key, value in result.items() if key not in _MODERN_ONLY}
    shaped.pop("_meta", None)
    return shaped


def answer(request_id: RequestId, result: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})


# The levels of logging/setLevel (RFC 5424's, as the 2025 revisions name them).
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


def negotiated(requested: object) -> str:
    """The version taskgate answers initialize with: the client's if it is of the 2025 era,
    else the newest of them (the client then decides whether it can go on)."""
    if isinstance(requested, str) and requested in LEGACY_VERSIONS:
        return requested
    return NEWEST


def initialize_result(
    version: str,
    capabilities: dict[str, Any],
    server_info: dict[str, str],
    *,
    logging: bool = False,
    subscribe: bool = False,
    tasks: bool = False,
) -> dict[str, Any]:
    """taskgate's answer to initialize. From what discover advertises, what a 2025-era client
    can use through taskgate: tools, prompts and resources with listChanged (taskgate's GET
    stream emits them), completions; logging when a backend serves it (`logging`: the level is
    sent to every upstream session of the client's); resources.subscribe when a 2025-era
    server routed for resources takes it (`subscribe`: relayed on its upstream session, its
    resources/updated relayed on the GET stream); the 2025-11-25 tasks capability when a
    2025-era server routed for tools runs tasks (`tasks`: gateway/pipeline/legacy_tasks.py).
    Never the tasks extension (2026-07-28's)."""
    offered: dict[str, Any] = {"tools": {"listChanged": True}}
    if "prompts" in capabilities:
        offered["prompts"] = {"listChanged": True}
    if "resources" in capabilities:
        offered["resources"] = {"listChanged": True, "subscribe": subscribe}
    if "completions" in capabilities:
        offered["completions"] = {}
    if logging:
        offered["logging"] = {}
    if tasks:
        offered["tasks"] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    return {"protocolVersion": version, "capabilities": offered, "serverInfo": server_info}


def relay_rewriter(backend: str, seen: Exchange) -> Rewriter:
    """Each message of a relayed event stream: a backend's request namespaced; the answer
    noted, so that a client closing the stream after it is not counted as having left."""

    def rewrite(data: bytes) -> bytes:
        if not seen.answered and b'"method"' not in data:
            seen.answered = True  # the one response a request's stream carries is its answer
        return rewrite_request(data, backend)

    return rewrite
