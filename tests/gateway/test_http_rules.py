"""taskgate answers every malformed or refused request as the core fixes, in a fixed order.

The core: basic/transports/streamable-http of MCP 2026-07-28 (docs/architecture.md, Sources).
"""

from __future__ import annotations

import itertools
from typing import Any

import aiohttp
import orjson
import pytest

from tests.support.gateway import gateway_config, running_gateway
from tests.support.issuer import jwt_auth, running_issuer
from tests.support.mcp import build_request, post_raw
from tests.support.procs import BackendProcess

ids = itertools.count(1)


def error_of(raw: bytes) -> tuple[Any, int]:
    message = orjson.loads(raw)
    assert message["jsonrpc"] == "2.0"
    return message["id"], message["error"]["code"]


def call(name: str = "echo", **params: Any) -> dict[str, Any]:
    arguments = {"text": "hi"} if name == "echo" else {}
    return build_request(
        "tools/call", {"name": name, "arguments": arguments, **params}, id=next(ids)
    )


async def test_get_and_delete_are_405_with_allow_post(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    for method in ("GET", "DELETE", "PUT", "PATCH"):
        async with http.request(method, gateway_url) as response:
            assert response.status == 405
            assert response.headers["Allow"] == "POST"
            assert error_of(await response.read()) == (None, -32600)


async def test_another_path_is_404_naming_the_mcp_path(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    elsewhere = gateway_url.rsplit("/", 1)[0] + "/not-mcp"
    async with http.post(elsewhere, json=call()) as response:
        assert response.status == 404
        assert response.content_type == "application/json"
        raw = await response.read()
    assert error_of(raw) == (None, -32600)
    assert "/mcp" in orjson.loads(raw)["error"]["message"]


async def test_an_accepted_notification_gets_202_and_an_empty_body(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    body = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    status, _, raw = await post_raw(http, gateway_url, orjson.dumps(body))
    assert (status, raw) == (202, b"")


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{not json", -32700),
        (b"\xff\xfe", -32700),
        (b"", -32700),
        (b'[{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}]', -32600),
        (b'"just a string"', -32600),
        (b'{"jsonrpc":"1.0","id":1,"method":"tools/list"}', -32600),
        (b'{"jsonrpc":"2.0","id":null,"method":"tools/list"}', -32600),
        (b'{"jsonrpc":"2.0","id":1,"result":{}}', -32600),
    ],
)
async def test_a_broken_envelope_is_400_with_a_parse_or_invalid_request_error(
    http: aiohttp.ClientSession, gateway_url: str, raw: bytes, code: int
) -> None:
    status, _, body = await post_raw(http, gateway_url, raw)
    assert status == 400
    assert error_of(body)[1] == code


async def test_errors_echo_the_request_id_where_there_is_one(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    body = {"jsonrpc": "2.0", "id": "req-7", "method": "tools/list", "params": []}
    status, _, raw = await post_raw(http, gateway_url, orjson.dumps(body))
    assert (status, error_of(raw)) == (400, ("req-7", -32600))


async def test_missing_meta_keys_are_400_invalid_params(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    body = call()
    del body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
    status, _, raw = await post_raw(http, gateway_url, body)
    assert (status, error_of(raw)) == (400, (body["id"], -32602))


async def test_an_unsupported_version_is_400_naming_the_supported_ones(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    body = call()
    body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2025-11-25"
    status, _, raw = await post_raw(
        http, gateway_url, body, headers={"MCP-Protocol-Version": "2025-11-25"}
    )
    assert status == 400
    error = orjson.loads(raw)["error"]
    assert error["code"] == -32022
    assert error["data"] == {"supported": ["2026-07-28"], "requested": "2025-11-25"}


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("Mcp-Method", "tools/list"),
        ("Mcp-Name", "whoami"),
        ("MCP-Protocol-Version", "2026-01-01"),
    ],
)
async def test_a_header_that_disagrees_with_the_body_is_400_header_mismatch(
    http: aiohttp.ClientSession, gateway_url: str, header: str, value: str
) -> None:
    body = call()
    status, _, raw = await post_raw(http, gateway_url, body, headers={header: value})
    assert (status, error_of(raw)) == (400, (body["id"], -32020))


@pytest.mark.parametrize("header", ["Mcp-Method", "MCP-Protocol-Version"])
async def test_a_missing_method_or_version_header_is_400_header_mismatch(
    http: aiohttp.ClientSession, gateway_url: str, header: str
) -> None:
    body = call()
    status, _, raw = await post_raw(http, gateway_url, body, drop=(header,))
    assert (status, error_of(raw)) == (400, (body["id"], -32020))


async def test_header_values_in_base64_form_match_the_decoded_body(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    body = call()
    status, _, raw = await post_raw(
        http, gateway_url, body, headers={"Mcp-Name": "=?base64?ZWNobw==?="}
    )
    assert status == 200
    assert orjson.loads(raw)["result"]["structuredContent"] == {"result": "hi"}


async def test_padded_header_values_are_accepted(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    body = call()
    status, _, _ = await post_raw(http, gateway_url, body, headers={"Mcp-Name": "echo \t"})
    assert status == 200


async def test_strict_headers_refuse_an_absent_mcp_name(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess]
) -> None:
    config = gateway_config(
        {"reports": [b.url for b in report_backends]},
        [(["echo"], "reports")],
        listen={"strict_headers": True},
    )
    async with running_gateway(config) as url:
        body = call()
        status, _, raw = await post_raw(http, url, body, drop=("Mcp-Name",))
        assert (status, error_of(raw)) == (400, (body["id"], -32020))


@pytest.mark.parametrize(
    "method",
    ["tasks/result", "tasks/list", "resources/subscribe", "no/such"],
)
async def test_unknown_and_removed_methods_are_404_method_not_found(
    http: aiohttp.ClientSession, gateway_url: str, method: str
) -> None:
    body = build_request(method, {}, id=next(ids))
    status, _, raw = await post_raw(http, gateway_url, body)
    assert (status, error_of(raw)) == (404, (body["id"], -32601))


async def test_checks_run_in_order_meta_version_headers_method(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    # Every request below is wrong twice; the earlier check in the order must answer.
    no_meta = build_request("no/such", {}, id=1)
    del no_meta["params"]["_meta"]
    status, _, raw = await post_raw(http, gateway_url, no_meta, headers={"Mcp-Method": "other"})
    assert (status, error_of(raw)[1]) == (400, -32602)

    old = build_request("no/such", {}, id=2)
    old["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "1999-01-01"
    status, _, raw = await post_raw(http, gateway_url, old, headers={"Mcp-Method": "other"})
    assert (status, error_of(raw)[1]) == (400, -32020)  # the version header disagrees first

    status, _, raw = await post_raw(
        http,
        gateway_url,
        old,
        headers={"Mcp-Method": "other", "MCP-Protocol-Version": "1999-01-01"},
    )
    assert (status, error_of(raw)[1]) == (400, -32022)

    mismatched = build_request("no/such", {}, id=3)
    status, _, raw = await post_raw(http, gateway_url, mismatched, headers={"Mcp-Method": "other"})
    assert (status, error_of(raw)[1]) == (400, -32020)


async def test_an_oversized_body_is_413_with_a_json_rpc_error(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess]
) -> None:
    config = gateway_config(
        {"reports": [b.url for b in report_backends]},
        [(["echo"], "reports")],
        listen={"max_body_bytes": 2048},
    )
    async with running_gateway(config) as url:
        body = build_request(
            "tools/call", {"name": "echo", "arguments": {"text": "x" * 4096}}, id=1
        )
        status, _, raw = await post_raw(http, url, body)
        assert (status, error_of(raw)[1]) == (413, -32600)


async def test_json_nested_too_deep_is_400_invalid_request(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    deep: Any = "bottom"
    for _ in range(100):
        deep = [deep]
    body = build_request("tools/call", {"name": "echo", "arguments": {"text": deep}}, id=5)
    status, _, raw = await post_raw(http, gateway_url, body)
    assert (status, error_of(raw)) == (400, (5, -32600))


async def test_a_body_that_is_not_json_content_is_415(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    status, _, raw = await post_raw(
        http, gateway_url, orjson.dumps(call()), headers={"Content-Type": "text/plain"}
    )
    assert (status, error_of(raw)[1]) == (415, -32600)


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://localhost:3000", True),
        ("http://127.0.0.1", True),
        ("http://[::1]:8080", True),
        ("https://evil.example", False),
        ("null", False),
    ],
)
async def test_only_loopback_origins_pass_by_default(
    http: aiohttp.ClientSession, gateway_url: str, origin: str, allowed: bool
) -> None:
    status, _, raw = await post_raw(http, gateway_url, call(), headers={"Origin": origin})
    if allowed:
        assert status == 200
    else:
        assert (status, error_of(raw)[1]) == (403, -32600)


async def test_configured_origins_pass(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess]
) -> None:
    config = gateway_config(
        {"reports": [b.url for b in report_backends]},
        [(["echo"], "reports")],
        listen={"allowed_origins": ["https://app.example"]},
    )
    async with running_gateway(config) as url:
        for origin, status in (("https://app.example", 200), ("https://other.example", 403)):
            assert (await post_raw(http, url, call(), headers={"Origin": origin})).status == status


async def test_a_disallowed_origin_is_403_even_without_a_token(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess]
) -> None:
    """The core: "If the Origin header is present and invalid, servers MUST respond with HTTP
    403 Forbidden", so the Origin is checked before the token (docs/decisions.md, 14)."""
    async with running_issuer("ES256") as issuer:
        config = gateway_config(
            {"reports": [b.url for b in report_backends]},
            [(["echo"], "reports")],
            auth=jwt_auth(issuer),
        )
        async with running_gateway(config) as url:
            evil = {"Origin": "https://evil.example"}
            status, _, raw = await post_raw(http, url, call(), headers=evil)
            assert (status, error_of(raw)[1]) == (403, -32600)
            async with http.get(url, headers=evil) as answer:
                assert answer.status == 403
            # Without an Origin, or with an allowed one, no token is still 401.
            for headers in ({}, {"Origin": "http://localhost:3000"}):
                assert (await post_raw(http, url, call(), headers=headers)).status == 401


async def test_a_rebound_host_name_is_403_on_a_loopback_listener(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess]
) -> None:
    config = gateway_config(
        {"reports": [b.url for b in report_backends]},
        [(["echo"], "reports")],
        listen={"allowed_hosts": ["gateway.internal"]},
    )
    async with running_gateway(config) as url:
        for host, status in (
            ("attacker.example", 403),
            ("gateway.internal:8080", 200),
            ("localhost:1234", 200),
        ):
            assert (await post_raw(http, url, call(), headers={"Host": host})).status == status
        # GET and DELETE pass the same admission: a rebound name is refused before the 405.
        for method in ("GET", "DELETE"):
            for host, status in (("attacker.example", 403), ("gateway.internal:8080", 405)):
                async with http.request(method, url, headers={"Host": host}) as answer:
                    assert (method, host, answer.status) == (method, host, status)


async def test_an_unrouted_tool_and_a_missing_tool_get_the_same_in_band_answer(
    http: aiohttp.ClientSession, gateway_url: str
) -> None:
    # "report_missing" matches the report_* route but exists on no replica;
    # "unrouted" matches no route at all. Neither answer may tell them apart.
    answers = []
    for name in ("report_missing", "unrouted"):
        body = build_request("tools/call", {"name": name, "arguments": {}}, id=99)
        status, _, raw = await post_raw(http, gateway_url, body)
        answers.append((status, orjson.loads(raw)))
    assert answers[0][0] == answers[1][0] == 200
    assert answers[0][1]["error"]["code"] == answers[1][1]["error"]["code"] == -32602
    assert answers[0][1]["error"]["message"] == "Unknown tool: report_missing"
    assert answers[1][1]["error"]["message"] == "Unknown tool: unrouted"
    assert answers[0][1]["error"].keys() == answers[1][1]["error"].keys()
