"""One POST body becomes one RPCRequest or one RPCNotification; anything else is an EnvelopeError.

Depth counts JSON containers (objects and arrays): the body object is level 1, `params`
level 2, an object inside `params` level 3, and so on. Scalars add no level.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocol.codes import Code, EnvelopeError
from gateway.protocol.envelope import (
    MAX_ID_LENGTH,
    MAX_SAFE_INTEGER,
    RPCNotification,
    RPCRequest,
    parse,
    request_id_of,
)

META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


def request(**fields: Any) -> dict[str, Any]:
    message: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "echo", "_meta": META},
    }
    message.update(fields)
    return message


def refusal(body: bytes, *, max_depth: int = 64) -> EnvelopeError:
    with pytest.raises(EnvelopeError) as info:
        parse(body, max_depth=max_depth)
    return info.value


def nested_body(depth: int, *, container: str = "object", member: str = "params") -> bytes:
    """A request whose deepest container sits at level `depth` (depth >= 2)."""
    leaf: Any = {} if container == "object" else []
    inner: Any = leaf
    for _ in range(depth - 3 if member == "params" else depth - 2):
        inner = {"x": inner} if container == "object" else [inner]
    if member == "params":
        params: dict[str, Any] = {"deep": inner} if depth >= 3 else {}
        return dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})
    return dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", member: inner})


# --- what parses ---------------------------------------------------------------------------


def test_a_request_parses_into_its_id_method_and_params() -> None:
    message = parse(dumps(request(id="abc")))

    assert isinstance(message, RPCRequest)
    assert message.id == "abc"
    assert message.method == "tools/call"
    assert message.params == {"name": "echo", "_meta": META}


def test_a_message_without_an_id_is_a_notification() -> None:
    body = dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})

    message = parse(body)

    assert isinstance(message, RPCNotification)
    assert message.method == "notifications/initialized"
    assert message.params == {}


def test_absent_params_read_as_an_empty_object() -> None:
    message = parse(b'{"jsonrpc":"2.0","id":3,"method":"server/discover"}')

    assert isinstance(message, RPCRequest)
    assert message.params == {}


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}}',
        b'  {\n  "params" : {"name":"\\u00e9cho", "n": 1.50},\r\n "method":"tools/call",'
        b' "id": 1 , "jsonrpc":"2.0"}\n\n',
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"日本"}}'.encode(),
        b'{"jsonrpc":"2.0","method":"n","params":{"a":{"b":[1,2,{"c":null}]}}}',
    ],
)
def test_the_body_is_kept_byte_for_byte(body: bytes) -> None:
    assert parse(body).body == body


# --- what is refused, and with which code --------------------------------------------------


@pytest.mark.parametrize("body", [b"[]", dumps([request()]), dumps([request(), request(id=2)])])
def test_a_batch_is_an_invalid_request(body: bytes) -> None:
    assert refusal(body).code == Code.INVALID_REQUEST


@pytest.mark.parametrize("body", [b"1", b'"tools/call"', b"null", b"true", b"2.5"])
def test_a_body_that_is_not_an_object_is_an_invalid_request(body: bytes) -> None:
    error = refusal(body)

    assert error.code == Code.INVALID_REQUEST
    assert error.request_id is None


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"   ",
        b"{",
        b'{"jsonrpc":"2.0",}',
        b"not json",
        b"{'jsonrpc':'2.0'}",
        b'{"id":NaN}',
        b"\xff\xfe{}",
        b'{"jsonrpc":"2.0","id":1,"method":"\xc3"}',  # truncated UTF-8 sequence
        b'{"jsonrpc":"2.0","id":1,"method":"\xed\xa0\x80"}',  # an encoded surrogate
    ],
)
def test_bytes_that_are_not_json_in_utf8_are_a_parse_error(body: bytes) -> None:
    error = refusal(body)

    assert error.code == Code.PARSE_ERROR
    assert error.request_id is None


@pytest.mark.parametrize("version", [None, "1.0", "2", 2.0, "2.0 ", ["2.0"]])
def test_jsonrpc_must_be_the_string_2_0(version: Any) -> None:
    message = request()
    if version is None:
        del message["jsonrpc"]
    else:
        message["jsonrpc"] = version

    error = refusal(dumps(message))

    assert error.code == Code.INVALID_REQUEST
    assert error.request_id == 1


@pytest.mark.parametrize("method", [None, "", 7, ["tools/call"], {"name": "x"}])
def test_method_must_be_a_non_empty_string(method: Any) -> None:
    message = request()
    if method is None:
        del message["method"]
    else:
        message["method"] = method

    assert refusal(dumps(message)).code == Code.INVALID_REQUEST


@pytest.mark.parametrize(
    "request_id",
    [
        None,
        1.5,
        1.0,
        True,
        False,
        {"n": 1},
        [1],
        "x" * (MAX_ID_LENGTH + 1),
        MAX_SAFE_INTEGER + 1,
        -MAX_SAFE_INTEGER - 1,
        2**64,
    ],
    ids=repr,
)
def test_an_invalid_id_is_refused_and_not_echoed(request_id: Any) -> None:
    error = refusal(dumps(request(id=request_id)))

    assert error.code == Code.INVALID_REQUEST
    assert error.request_id is None


@pytest.mark.parametrize(
    "request_id", [0, -1, MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, "", "x" * MAX_ID_LENGTH, "ü-1"]
)
def test_ids_at_the_limits_are_accepted(request_id: str | int) -> None:
    message = parse(dumps(request(id=request_id)))

    assert isinstance(message, RPCRequest)
    assert message.id == request_id


@pytest.mark.parametrize("params", [[], ["echo"], "echo", 1, None, True])
def test_params_that_are_not_an_object_are_refused_with_the_id(params: Any) -> None:
    error = refusal(dumps(request(id="req-9", params=params)))

    assert error.code == Code.INVALID_REQUEST
    assert error.request_id == "req-9"


def test_errors_found_after_the_id_was_read_carry_it() -> None:
    assert refusal(dumps(request(id=41, jsonrpc="1.0"))).request_id == 41
    assert refusal(dumps(request(id=42, method=3))).request_id == 42
    assert refusal(dumps(request(id=43, params="x"))).request_id == 43


@pytest.mark.parametrize(
    "response",
    [
        {"jsonrpc": "2.0", "id": 5, "result": {}},
        {"jsonrpc": "2.0", "id": 5, "error": {"code": -32601, "message": "no"}},
        {"jsonrpc": "2.0", "id": 5, "method": None, "result": {"resultType": "complete"}},
    ],
)
def test_a_posted_response_is_an_invalid_request(response: dict[str, Any]) -> None:
    error = refusal(dumps(response))

    assert error.code == Code.INVALID_REQUEST
    assert error.request_id == 5


# --- nesting depth -------------------------------------------------------------------------


@pytest.mark.parametrize("max_depth", [4, 8, 64])
@pytest.mark.parametrize("container", ["object", "array"])
def test_nesting_exactly_max_depth_passes(max_depth: int, container: str) -> None:
    message = parse(nested_body(max_depth, container=container), max_depth=max_depth)

    assert isinstance(message, RPCRequest)


@pytest.mark.parametrize("max_depth", [4, 8, 64])
@pytest.mark.parametrize("container", ["object", "array"])
def test_nesting_deeper_than_max_depth_is_an_invalid_request(
    max_depth: int, container: str
) -> None:
    error = refusal(nested_body(max_depth + 1, container=container), max_depth=max_depth)

    assert error.code == Code.INVALID_REQUEST
    assert error.request_id == 7


def test_the_depth_helper_builds_the_depth_it_names() -> None:
    def depth(value: Any) -> int:
        if isinstance(value, dict):
            return 1 + max((depth(v) for v in value.values()), default=0)
        if isinstance(value, list):
            return 1 + max((depth(v) for v in value), default=0)
        return 0

    for n in (2, 3, 4, 10):
        assert depth(json.loads(nested_body(n))) == n
        assert depth(json.loads(nested_body(n, container="array"))) == n
        assert depth(json.loads(nested_body(n, member="extra"))) == n


def test_nesting_outside_params_counts_too() -> None:
    """Every member is forwarded upstream as received, so the bound covers the whole body."""
    assert isinstance(parse(nested_body(6, member="extra"), max_depth=6), RPCRequest)

    error = refusal(nested_body(7, member="extra"), max_depth=6)

    assert error.code == Code.INVALID_REQUEST


def test_a_scalar_at_the_deepest_level_adds_no_depth() -> None:
    body = dumps(request(params={"a": {"b": "leaf"}}))  # body 1, params 2, a 3

    assert isinstance(parse(body, max_depth=3), RPCRequest)
    assert refusal(body, max_depth=2).code == Code.INVALID_REQUEST


def test_nesting_past_the_json_parsers_own_limit_is_still_an_envelope_error() -> None:
    body = (
        b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":' + b"[" * 5000 + b"]" * 5000 + b"}}"
    )

    assert refusal(body).code in (Code.INVALID_REQUEST, Code.PARSE_ERROR)


# --- nothing but RPCRequest, RPCNotification or EnvelopeError ------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["2.0", "tools/call", "", MAX_SAFE_INTEGER, MAX_SAFE_INTEGER + 1])
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=24,
)
_envelopes = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.just("2.0") | _json,
        "id": st.integers() | st.text(max_size=300) | _json,
        "method": st.sampled_from(["tools/call", "tasks/get", ""]) | _json,
        "params": st.dictionaries(st.text(max_size=6), _json, max_size=4) | _json,
        "result": _json,
        "error": _json,
        "extra": _json,
    },
)


def _parses_or_refuses(body: bytes, max_depth: int) -> None:
    refused: EnvelopeError | None = None
    try:
        message = parse(body, max_depth=max_depth)
    except EnvelopeError as error:  # any other exception fails the test
        refused = error
    if refused is not None:
        assert refused.code in (Code.PARSE_ERROR, Code.INVALID_REQUEST)
        assert refused.request_id is None or isinstance(refused.request_id, str | int)
        return
    assert isinstance(message, RPCRequest | RPCNotification)
    assert message.body == body
    assert isinstance(message.params, dict)
    if isinstance(message, RPCRequest):
        assert not isinstance(message.id, bool)
        assert isinstance(message.id, str | int)


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=256), max_depth=st.integers(min_value=1, max_value=64))
def test_any_bytes_parse_or_raise_an_envelope_error(body: bytes, max_depth: int) -> None:
    _parses_or_refuses(body, max_depth)


@settings(max_examples=300, deadline=None)
@given(value=_json | _envelopes, max_depth=st.integers(min_value=1, max_value=8))
def test_any_json_value_parses_or_raises_an_envelope_error(value: Any, max_depth: int) -> None:
    _parses_or_refuses(json.dumps(value).encode(), max_depth)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"tools/list","params":{}}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","name":"b"}}',
        b'{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list","params":{}}',
        b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":{"deep":[{"k":1,"k":2}]}}}',
        # colons inside strings must not hide a repeat from the counting fast path
        b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"u":"a:b","k":1,"k":2}}',
        b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"k:":1,"k:":2}}',
    ],
)
def test_a_body_thatrepeats_a_key_anywhere_is_refused(raw: bytes) -> None:
    # A backend that reads the first copy could act on another method or tool than the one
    # taskgate routed and authorized on the last copy.
    with pytest.raises(EnvelopeError) as refused:
        parse(raw)
    assert refused.value.code == Code.INVALID_REQUEST


@pytest.mark.parametrize(
    "raw",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"url":"http://x:1/","t":"10:30"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"a:b":{"a:b":[":",{"c":"::"}]}}}',
        b'{"jsonrpc" : "2.0", "id" : 1, "method" : "m", "params" : {"k" : {"k" : 1}}}',
    ],
)
def test_colons_in_strings_and_a_key_reused_at_other_levels_are_not_repeats(raw: bytes) -> None:
    assert isinstance(parse(raw), RPCRequest)


def _object_text(draw: st.DrawFn, depth: int) -> str:
    """JSON object text whose keys may repeat and whose strings may hold colons."""
    keys = st.sampled_from(["a", "b", "a:", ":", "c:d"])
    members = []
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        key = json.dumps(draw(keys))
        if depth > 0 and draw(st.booleans()):
            value = _object_text(draw, depth - 1)
            if draw(st.booleans()):
                value = f"[{value}, {json.dumps(draw(keys))}]"
        else:
            value = json.dumps(draw(st.sampled_from(["x", "y:z", 1, None])))
        members.append(f"{key}: {value}")
    return "{" + ", ".join(members) + "}"


@st.composite
def _bodies_with_params(draw: st.DrawFn) -> bytes:
    params = _object_text(draw, depth=3)
    return f'{{"jsonrpc": "2.0", "id": 1, "method": "m", "params": {params}}}'.encode()


def _repeats_per_standard_parser(raw: bytes) -> bool:
    repeated = False

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal repeated
        keys = [key for key, _ in pairs]
        repeated = repeated or len(set(keys)) != len(keys)
        return dict(pairs)

    json.loads(raw, object_pairs_hook=hook)
    return repeated


@settings(max_examples=500, deadline=None)
@given(raw=_bodies_with_params())
def test_the_repeat_check_agrees_with_the_standard_parser(raw: bytes) -> None:
    if _repeats_per_standard_parser(raw):
        with pytest.raises(EnvelopeError, match="repeats a key"):
            parse(raw)
    else:
        assert isinstance(parse(raw), RPCRequest)


def test_a_refusal_before_parsing_reads_the_id_of_a_body_it_can_afford() -> None:
    assert request_id_of(b'{"jsonrpc":"2.0","id":7,"method":"tools/call"}') == 7
    assert request_id_of(b'{"id":"a"}') == "a"
    assert request_id_of(b'{"id":true}') is None  # not an id
    assert request_id_of(b'[{"id":1}]') is None  # a batch: no one id
    assert request_id_of(b'{"id":1') is None  # not JSON
    large = b'{"id":9,"params":{"text":"' + b"x" * 70_000 + b'"}}'
    assert request_id_of(large) is None  # over 64 KiB: not parsed for a refusal
