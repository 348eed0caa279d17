"""Every refusal becomes a JSON-RPC error body with the HTTP status the core's transport fixes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.errors import (
    GatewayError,
    HTTPRefusal,
    InBandError,
    Retryable,
    UnknownTool,
    UpstreamTimeout,
    error_body,
    from_protocol,
)
from gateway.protocol.codes import (
    CapabilityError,
    Code,
    EnvelopeError,
    HeaderError,
    MetaError,
    MethodError,
    ProtocolError,
    VersionError,
)


def parsed(body: bytes) -> dict[str, Any]:
    value = json.loads(body)
    assert isinstance(value, dict)
    return value


def assert_jsonrpc_error(body: bytes) -> dict[str, Any]:
    value = parsed(body)
    assert set(value) == {"jsonrpc", "id", "error"}
    assert value["jsonrpc"] == "2.0"
    assert value["id"] is None or isinstance(value["id"], str | int)
    assert isinstance(value["error"]["code"], int)
    assert isinstance(value["error"]["message"], str)
    assert set(value["error"]) <= {"code", "message", "data"}
    return value


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (EnvelopeError("bad"), 400, -32600),
        (EnvelopeError("bad", code=Code.PARSE_ERROR), 400, -32700),
        (MetaError("bad"), 400, -32602),
        (VersionError("bad"), 400, -32022),
        (HeaderError("bad"), 400, -32020),
        (MethodError("bad"), 404, -32601),
        (CapabilityError("bad"), 400, -32021),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_protocol_errors_map_to_their_status(exc: ProtocolError, status: int, code: int) -> None:
    error = from_protocol(exc)

    assert error.status == status
    assert error.code == code
    assert assert_jsonrpc_error(error.body())["error"]["code"] == code


def test_the_mapping_keeps_id_message_and_data() -> None:
    exc = VersionError(
        "Unsupported protocol version",
        request_id="r-7",
        data={"supported": ["2026-07-28"], "requested": "x"},
    )

    body = assert_jsonrpc_error(from_protocol(exc).body())

    assert body["id"] == "r-7"
    assert body["error"] == {
        "code": -32022,
        "message": "Unsupported protocol version",
        "data": {"supported": ["2026-07-28"], "requested": "x"},
    }


def test_a_subclass_of_a_protocol_error_maps_like_its_parent() -> None:
    class RemovedMethod(MethodError):
        pass

    class Bare(ProtocolError):
        pass

    assert from_protocol(RemovedMethod("gone")).status == 404
    assert from_protocol(Bare("bad")).status == 400
    assert from_protocol(ProtocolError("bad")).status == 400


@pytest.mark.parametrize("request_id", [None, 0, 42, "abc", ""])
def test_error_body_is_jsonrpc_with_the_id_or_null(request_id: str | int | None) -> None:
    body = assert_jsonrpc_error(error_body(request_id, Code.INVALID_REQUEST, "Invalid request"))

    assert body["id"] == request_id
    assert body["error"] == {"code": -32600, "message": "Invalid request"}


def test_error_body_includes_data_only_when_given() -> None:
    assert "data" not in parsed(error_body(1, -32603, "x"))["error"]
    assert parsed(error_body(1, -32603, "x", {"retryable": False}))["error"]["data"] == {
        "retryable": False
    }
    assert parsed(error_body(1, -32603, "x", []))["error"]["data"] == []


def test_an_unknown_id_is_null_not_absent() -> None:
    assert "id" in parsed(error_body(None, Code.PARSE_ERROR, "Parse error"))


def test_a_plain_gateway_error_is_an_internal_error_on_500() -> None:
    error = GatewayError("Internal error")

    assert (error.status, error.code, error.headers) == (500, Code.INTERNAL_ERROR, {})
    assert assert_jsonrpc_error(error.body())["id"] is None


def test_retryable_is_503_with_retry_after() -> None:
    error = Retryable("no replica answered", request_id=9)

    assert error.status == 503
    assert error.headers == {"Retry-After": "1"}
    body = assert_jsonrpc_error(error.body())
    assert body["id"] == 9
    assert body["error"]["code"] == -32603
    assert body["error"]["data"]["retryable"] is True


def test_retryable_names_its_delay() -> None:
    assert Retryable("later", retry_after_s=7).headers == {"Retry-After": "7"}


def test_headers_are_not_shared_between_errors() -> None:
    first, second = GatewayError("a"), GatewayError("b")
    first.headers["X"] = "1"

    assert second.headers == {}


def test_an_upstream_timeout_is_504_and_not_retryable() -> None:
    error = UpstreamTimeout("no answer", request_id="t")

    assert error.status == 504
    assert assert_jsonrpc_error(error.body())["error"]["data"] == {"retryable": False}


def test_an_unknown_tool_is_in_band_invalid_params() -> None:
    error = UnknownTool("reprot", request_id=4)

    assert isinstance(error, InBandError)
    assert error.status == 200
    body = assert_jsonrpc_error(error.body())
    assert body["id"] == 4
    assert body["error"] == {"code": -32602, "message": "Unknown tool: reprot"}


def test_an_http_refusal_takes_its_status_and_is_an_invalid_request() -> None:
    error = HTTPRefusal("Forbidden", status=403)

    assert error.status == 403
    assert assert_jsonrpc_error(error.body())["error"]["code"] == -32600
