"""Parse one POST body into an RPCRequest or an RPCNotification, or raise EnvelopeError."""

from __future__ import annotations

import json
from typing import Any, Final

import orjson

from gateway.protocol.codes import Code, EnvelopeError, RequestId

JSONObject = dict[str, Any]

# A JSON-RPC id is echoed into every error and log line; a bound keeps both small.
MAX_ID_LENGTH = 256
# Integers beyond this do not survive a round trip through many JSON parsers (IEEE doubles).
MAX_SAFE_INTEGER = 2**53 - 1


# The message classes below are made once per request: plain classes rather than dataclasses,
# whose generated __init__ stays interpreted Python in the compiled build (a profile found the
# dataclasses' __init__ and __hash__ at 3.5% of taskgate's CPU per tasks/get). Final keeps them
# read-only where mypy looks.


class RPCRequest:
    """A JSON-RPC request: routed on `method` and `params`, forwarded as `body`, byte for byte."""

    __slots__ = ("body", "id", "method", "params")

    def __init__(self, id: RequestId, method: str, params: JSONObject, body: bytes) -> None:
        self.id: Final = id
        self.method: Final = method
        self.params: Final = params
        self.body: Final = body


class RPCNotification:
    """A JSON-RPC notification (no id): answered 202 once accepted."""

    __slots__ = ("body", "method", "params")

    def __init__(self, method: str, params: JSONObject, body: bytes) -> None:
        self.method: Final = method
        self.params: Final = params
        self.body: Final = body


Message = RPCRequest | RPCNotification


def parse(body: bytes, *, max_depth: int = 64) -> Message:
    """The one message in `body`, or EnvelopeError; no other exception escapes."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise EnvelopeError(f"Parse error: {exc}", code=Code.PARSE_ERROR) from None
    if isinstance(value, list):
        raise EnvelopeError("Invalid request: batches are not supported; send one message per POST")
    if not isinstance(value, dict):
        raise EnvelopeError("Invalid request: the body must be a JSON-RPC object")
    request_id = _read_id(value)
    if value.get("jsonrpc") != "2.0":
        raise EnvelopeError('Invalid request: "jsonrpc" must be "2.0"', request_id=request_id)
    method = value.get("method")
    if method is None and ("result" in value or "error" in value):
        raise EnvelopeError(
            "Invalid request: a client may not POST a JSON-RPC response", request_id=request_id
        )
    if not isinstance(method, str) or not method:
        raise EnvelopeError('Invalid request: "method" must be a string', request_id=request_id)
    params = value.get("params", {})
    if not isinstance(params, dict):
        raise EnvelopeError('Invalid request: "params" must be an object', request_id=request_id)
    check_shape(body, value, max_depth, request_id)
    if "id" not in value:
        return RPCNotification(method=method, params=params, body=body)
    if request_id is None:
        raise EnvelopeError(
            'Invalid request: "id" must be a string (at most '
            f"{MAX_ID_LENGTH} characters) or an integer (at most 2**53 - 1), never null"
        )
    return RPCRequest(id=request_id, method=method, params=params, body=body)


def check_shape(body: bytes, value: Any, max_depth: int, request_id: RequestId | None) -> None:
    """EnvelopeError when `body` (parsed into `value`) nests deeper than `max_depth` or repeats
    a key in any object."""
    # The body object is level 1 (params level 2): max_depth - 1 levels may nest below it.
    # The whole body is measured, not only params: every member is forwarded as it came.
    # Counting brackets (in C) bounds the depth from above: most bodies skip the walk.
    if body.count(b"{") + body.count(b"[") > max_depth and _depth_exceeds(value, max_depth - 1):
        raise EnvelopeError(
            f"Invalid request: JSON nested deeper than {max_depth} levels", request_id=request_id
        )
    if repeats_a_key(body, value):
        raise EnvelopeError(
            "Invalid request: an object repeats a key (parsers disagree on which copy counts)",
            request_id=request_id,
        )


class _Repeated(Exception):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> None:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _Repeated


def repeats_a_key(body: bytes, value: Any) -> bool:
    """Whether any object in `body` (parsed by orjson into `value`) repeats a key. taskgate
    reads the last copy of a key and forwards the bytes: a backend reading the first could act
    on another method or tool than the one taskgate routed and authorized, so such bodies are
    refused.

    orjson keeps no pairs, so first an exact count: outside strings, JSON has a colon only
    between a key and its value, so the body's colons are its key tokens plus the colons inside
    strings, while orjson's objects hold the key tokens minus the repeats. Equal counts mean no
    repeat (and no colon in any string): about 2 us. Otherwise the standard parser's pair hook
    decides (about 9 us): a colon in some string, or a real repeat.
    """
    if body.count(b":") == _key_count(value):
        return False
    try:
        json.loads(body, object_pairs_hook=_unique_pairs)
    except _Repeated:
        return True
    return False


def _key_count(value: Any) -> int:
    """How many keys the objects in `value` hold, all levels together."""
    count = 0
    stack = [value]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            count += len(node)
            node = node.values()
        elif type(node) is not list:
            continue
        for child in node:
            if type(child) is dict or type(child) is list:
                stack.append(child)
    return count


# A refusal reads the id of a body up to this size: a refused flood of large bodies must not
# cost a parse each (the answer is an HTTP 429 or 503 either way).
_ID_PROBE_BYTES = 64 * 1024


def request_id_of(body: bytes) -> RequestId | None:
    """The id of the request in `body`, for an answer given before the body is parsed (a
    refusal at admission): None when it is not a JSON object with a valid id, or is larger
    than _ID_PROBE_BYTES."""
    if len(body) > _ID_PROBE_BYTES:
        return None
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return _read_id(value) if type(value) is dict else None


def _read_id(value: JSONObject) -> RequestId | None:
    """The id when it is a valid one (so errors can echo it); None when absent or invalid."""
    raw = value.get("id")
    if isinstance(raw, bool):  # bool is an int subclass; true is no id
        return None
    if isinstance(raw, int) and -MAX_SAFE_INTEGER <= raw <= MAX_SAFE_INTEGER:
        return raw
    if isinstance(raw, str) and len(raw) <= MAX_ID_LENGTH:
        return raw
    return None


def _depth_exceeds(value: Any, budget: int) -> bool:
    """True when `value` nests containers more than `budget` levels below itself."""
    stack: list[tuple[Any, int]] = [(value, budget)]
    while stack:
        node, left = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, dict | list):
                if left <= 0:
                    return True
                stack.append((child, left - 1))
    return False
