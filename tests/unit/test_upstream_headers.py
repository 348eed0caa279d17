"""The header block taskgate sends upstream: what passes, what taskgate sets, what it refuses."""

from __future__ import annotations

import pytest

from gateway.errors import UnsafeHeader
from gateway.upstream import relay
from gateway.upstream.relay import upstream_headers


def lines(block: bytes) -> list[bytes]:
    assert block.endswith(b"\r\n")
    return block[:-2].split(b"\r\n")


def test_only_allowlisted_and_mcp_param_headers_pass_with_their_exact_bytes() -> None:
    raw = [
        (b"Content-Type", b"application/json"),
        (b"Authorization", b"Bearer client-secret"),
        (b"Cookie", b"a=1"),
        (b"MCP-Protocol-Version", b"2026-07-28"),
        (b"mcp-param-Region", "café".encode()),
        (b"Connection", b"keep-alive"),
        (b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        (b"Accept", b"application/json, text/event-stream"),
    ]
    block = upstream_headers(raw, name=None, extra={})
    assert lines(block) == [
        b"Content-Type: application/json",
        b"MCP-Protocol-Version: 2026-07-28",
        b"mcp-param-Region: caf\xc3\xa9",
        b"traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        b"Accept: application/json, text/event-stream",
    ]


def test_taskgate_sets_mcp_name_and_its_own_headers_replacing_the_clients() -> None:
    raw = [
        (b"Mcp-Name", b"spoofed"),
        (b"X-Tenant", b"someone-else"),  # not allowlisted anyway
        (b"mcp-param-x-tenant", b"smuggled"),  # allowlisted by prefix, but taskgate's own
    ]
    extra = {"Mcp-Param-X-Tenant": "acme", "Authorization": "Bearer upstream"}
    block = upstream_headers(raw, name="ünïcode tool", extra=extra)
    got = lines(block)
    assert b"Mcp-Name: spoofed" not in got
    assert b"mcp-param-x-tenant: smuggled" not in got
    assert b"Mcp-Param-X-Tenant: acme" in got
    assert b"Authorization: Bearer upstream" in got
    (name_line,) = [line for line in got if line.lower().startswith(b"mcp-name:")]
    assert name_line.startswith(b"Mcp-Name: =?base64?")  # not ASCII-safe: the base64 form


def test_accept_and_content_type_default_once() -> None:
    assert lines(upstream_headers([], name=None, extra={})) == [
        b"Accept: application/json, text/event-stream",
        b"Content-Type: application/json",
    ]
    block = upstream_headers(
        [(b"accept", b"application/json"), (b"content-type", b"application/json")],
        name=None,
        extra={},
    )
    assert lines(block) == [b"accept: application/json", b"content-type: application/json"]


@pytest.mark.parametrize("bad", ["a\r\nX-Injected: 1", "a\nb", "a\rb", "a\0b"])
def test_a_value_of_taskgates_own_that_could_split_the_request_is_refused(bad: str) -> None:
    with pytest.raises(UnsafeHeader) as refused:
        upstream_headers([], name=None, extra={"X-Principal": bad})
    assert refused.value.status == 400


def test_the_memo_of_header_names_stays_bounded_and_right() -> None:
    names = [b"X-Odd-%d" % n for n in range(3 * relay._FORWARDED_MEMO)]
    block = upstream_headers([(n, b"v") for n in names], name=None, extra={})
    assert not any(line.startswith(b"X-Odd") for line in lines(block))
    assert len(relay._forwarded) <= relay._FORWARDED_MEMO
    late = [(b"Mcp-Param-Late-Arrival", b"1"), (b"TRACESTATE", b"k=v")]
    assert lines(upstream_headers(late, name=None, extra={}))[:2] == [
        b"Mcp-Param-Late-Arrival: 1",
        b"TRACESTATE: k=v",
    ]
