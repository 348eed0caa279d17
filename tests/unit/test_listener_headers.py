"""The listener's header lookup: case-insensitive, every value in order, decoded as aiohttp did."""

from __future__ import annotations

from gateway.h1.headers import Headers
from gateway.protocol.headers import RoutingHeaders


def headers_of(*pairs: tuple[bytes, bytes]) -> Headers:
    # As the server indexes them while parsing: by lower-cased name, values in arrival order.
    index: dict[bytes, list[bytes]] = {}
    for name, value in pairs:
        index.setdefault(name.lower(), []).append(value)
    return Headers(index)


def test_names_are_case_insensitive_both_ways() -> None:
    headers = headers_of((b"AUTHORIZATION", b"Bearer a"), (b"mcp-method", b"tools/call"))
    assert headers.get("Authorization") == "Bearer a"
    assert headers.get("authorization") == "Bearer a"
    assert headers.get("Mcp-Method") == "tools/call"


def test_every_value_of_a_repeated_header_in_order_and_the_first_for_get() -> None:
    headers = headers_of((b"Authorization", b"Bearer a"), (b"authorization", b"Bearer b"))
    assert headers.getall("Authorization") == ["Bearer a", "Bearer b"]
    assert headers.get("Authorization") == "Bearer a"


def test_a_missing_header_is_the_default() -> None:
    headers = headers_of((b"Host", b"h"))
    assert headers.get("Origin") is None
    assert headers.get("Origin", "none") == "none"
    assert headers.getall("Authorization") == ()


def test_values_decode_as_utf8_and_keep_other_bytes_as_surrogates() -> None:
    headers = headers_of((b"X-Name", "ünï".encode()), (b"X-Raw", b"\xff\xfe"))
    assert headers.get("X-Name") == "ünï"
    raw = headers.get("X-Raw")
    assert raw is not None
    assert raw.encode("utf-8", "surrogateescape") == b"\xff\xfe"


def test_routing_headers_read_every_value_so_duplicates_show() -> None:
    headers = headers_of(
        (b"Mcp-Method", b"tools/call"),
        (b"MCP-METHOD", b"tools/list"),
        (b"mcp-protocol-version", b"2026-07-28"),
    )
    routing = RoutingHeaders.of(headers)
    assert routing.method == ("tools/call", "tools/list")
    assert routing.protocol_version == ("2026-07-28",)
    assert routing.name == ()
