"""The routing headers mirror the body; values may travel as =?base64?...?= and are trimmed."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from gateway.protocol.codes import Code, HeaderError, VersionError
from gateway.protocol.envelope import RPCRequest
from gateway.protocol.headers import RoutingHeaders, check_headers, decode_value, encode_value
from gateway.protocol.meta import Meta

VERSION = "2026-07-28"
META = Meta(protocol_version=VERSION, client_capabilities={})
# What a header may carry as it is: visible ASCII and inner spaces, no edge whitespace.
HEADER_SAFE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")


def routing_of(pairs: list[tuple[str, str]]) -> RoutingHeaders:
    """The routing headers as the handler reads them: from a case-insensitive multidict."""
    return RoutingHeaders.of(CIMultiDict(pairs))


def b64(value: str) -> str:
    return "=?base64?" + base64.b64encode(value.encode()).decode() + "?="


def request(method: str, request_id: str | int = 3, **params: Any) -> RPCRequest:
    return RPCRequest(id=request_id, method=method, params=params, body=b"{}")


def headers(method: str | None, name: str | None = None, **extra: str) -> RoutingHeaders:
    pairs = []
    if "version" not in extra:
        pairs.append(("MCP-Protocol-Version", VERSION))
    elif extra["version"]:
        pairs.append(("MCP-Protocol-Version", extra["version"]))
    if method is not None:
        pairs.append(("Mcp-Method", method))
    if name is not None:
        pairs.append(("Mcp-Name", name))
    return routing_of(pairs)


def mismatch(message: RPCRequest, routing: RoutingHeaders, *, strict: bool = False) -> HeaderError:
    with pytest.raises(HeaderError) as info:
        check_headers(message, META, routing, strict=strict)
    assert info.value.request_id == message.id
    return info.value


# --- the value form -----------------------------------------------------------------------

_sentinel_like = st.text(max_size=20).map(lambda s: f"=?base64?{s}?=")
_edge_cases = st.sampled_from(
    [
        "",
        " ",
        "\t",
        " padded ",
        "get_weather",
        "two words",
        "=?base64?",
        "?=",
        "=?base64?=",
        "=?base64??=",
        "=?base64?literal?=",
        "=?base64?Zm9v?=",
        "=?BASE64?Zm9v?=",
        "line1\nline2",
        "Hello, 世界",
        "héllo",
        "\x00",
        "\x7f",
        "tab\tinside",
    ]
)


@settings(max_examples=300, deadline=None)
@given(value=st.text() | _sentinel_like | _edge_cases)
def test_every_string_survives_the_header_form(value: str) -> None:
    encoded = encode_value(value)

    assert HEADER_SAFE.fullmatch(encoded), encoded
    assert decode_value(encoded) == value
    # OWS a proxy may add around the value changes nothing.
    assert decode_value(f" \t{encoded}\t ") == value


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        ("us-west1", "us-west1"),
        ("get_weather", "get_weather"),
        ("file:///projects/my app/config.json", "file:///projects/my app/config.json"),
        ("Hello, 世界", "=?base64?SGVsbG8sIOS4lueVjA==?="),
        (" padded ", "=?base64?IHBhZGRlZCA=?="),
        ("line1\nline2", "=?base64?bGluZTEKbGluZTI=?="),
        ("=?base64?literal?=", "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="),
        ("", "=?base64??="),
    ],
)
def test_values_are_encoded_as_the_spec_shows(value: str, encoded: str) -> None:
    assert encode_value(value) == encoded


@pytest.mark.parametrize(
    "value", ["=?base64?a b?=", "=?base64?%%%?=", "=?base64?=", "=?base64?日本?="]
)
def test_any_value_matching_the_sentinel_pattern_is_encoded(value: str) -> None:
    """The core's transport: "starts with =?base64? and ends with ?=", whatever lies between."""
    assert encode_value(value) == b64(value)


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("  tools/call", "tools/call"),
        ("tools/call\t", "tools/call"),
        (" \t tools/call \t ", "tools/call"),
        ("two words", "two words"),
        (f"  {b64('héllo')}\t", "héllo"),
        ("", ""),
        ("   ", ""),
    ],
)
def test_decoding_trims_spaces_and_tabs_around_the_value(raw: str, value: str) -> None:
    assert decode_value(raw) == value


def test_the_markers_are_case_sensitive() -> None:
    assert decode_value("=?BASE64?Zm9v?=") == "=?BASE64?Zm9v?="
    assert decode_value("=?base64?Zm9v?=") == "foo"


@pytest.mark.parametrize(
    "raw",
    [
        "=?base64?Zm9v?",  # no closing marker: a plain value, see below
    ],
)
def test_a_value_that_only_starts_like_the_sentinel_is_plain(raw: str) -> None:
    assert decode_value(raw) == raw


@pytest.mark.parametrize(
    "raw",
    [
        "=?base64?abc?=",  # length not a multiple of four
        "=?base64?QQ?=",  # padding missing
        "=?base64?%%%?=",  # not the base64 alphabet
        "=?base64?Zm9v YmFy?=",  # inner space
        "=?base64?Zm9v\nYmFy?=",
        "=?base64?Zm9v=?=",  # stray padding
        "=?base64?QR==?=",  # non-canonical: the spare bits are not zero
        "=?base64?Zm9vYg=?=",
        "=?base64?-_-_?=",  # the URL-safe alphabet is not base64
        "=?base64?/w==?=",  # 0xff: not UTF-8
        "=?base64?7aCA?=",  # an encoded surrogate: not UTF-8
        "=?base64?w6l?=",
        "=?base64?日本?=",
        "=?base64?=",  # markers overlap: no payload
    ],
)
def test_a_malformed_sentinel_decodes_to_none(raw: str) -> None:
    assert decode_value(raw) is None


@pytest.mark.parametrize("raw", ["line1\nline2", "a\rb", "nul\x00", "del\x7f", "héllo", "日本"])
def test_a_plain_value_with_characters_a_header_cannot_carry_decodes_to_none(raw: str) -> None:
    assert decode_value(raw) is None


# --- RoutingHeaders -----------------------------------------------------------------------


def test_header_names_are_case_insensitive() -> None:
    routing = routing_of(
        [
            ("mcp-protocol-version", VERSION),
            ("MCP-METHOD", "tools/call"),
            ("mCp-NaMe", "echo"),
            ("Content-Type", "application/json"),
            ("Mcp-Param-Region", "eu"),
        ]
    )

    assert (routing.protocol_version, routing.method, routing.name) == (
        (VERSION,),
        ("tools/call",),
        ("echo",),
    )
    assert check_headers(request("tools/call", name="echo"), META, routing, strict=True) == "echo"


def test_every_value_of_a_repeated_header_is_kept() -> None:
    routing = routing_of([("Mcp-Name", "a"), ("mcp-name", "b")])

    assert routing.name == ("a", "b")


# --- check_headers ------------------------------------------------------------------------


def test_matching_headers_return_the_routing_name() -> None:
    assert (
        check_headers(request("tools/call", name="echo"), META, headers("tools/call", "echo"))
        == "echo"
    )


def test_a_missing_protocol_version_header_is_a_header_mismatch() -> None:
    error = mismatch(request("tools/list"), headers("tools/list", version=""))

    assert error.code == Code.HEADER_MISMATCH
    assert int(error.code) == -32020


def test_a_missing_method_header_is_a_header_mismatch() -> None:
    assert mismatch(request("tools/list"), headers(None)).code == Code.HEADER_MISMATCH


@pytest.mark.parametrize(
    "pairs",
    [
        [
            ("MCP-Protocol-Version", VERSION),
            ("MCP-Protocol-Version", VERSION),
            ("Mcp-Method", "tools/call"),
        ],
        [
            ("MCP-Protocol-Version", VERSION),
            ("Mcp-Method", "tools/call"),
            ("mcp-method", "tools/call"),
        ],
        [
            ("MCP-Protocol-Version", VERSION),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "echo"),
            ("Mcp-Name", "echo"),
        ],
        [
            ("MCP-Protocol-Version", VERSION),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "echo"),
            ("MCP-NAME", "other"),
        ],
    ],
)
def test_a_repeated_routing_header_is_a_header_mismatch(pairs: list[tuple[str, str]]) -> None:
    routing = routing_of(pairs)

    assert mismatch(request("tools/call", name="echo"), routing).code == Code.HEADER_MISMATCH


@pytest.mark.parametrize("version", ["2025-11-25", "2026-07-29", " 2026-07-28x"])
def test_a_protocol_version_header_unlike_the_body_is_a_header_mismatch(version: str) -> None:
    assert (
        mismatch(request("tools/list"), headers("tools/list", version=version)).code
        == Code.HEADER_MISMATCH
    )


@pytest.mark.parametrize("method", ["tools/list", "Tools/Call", "TOOLS/CALL", "tools/call/"])
def test_a_method_header_unlike_the_body_is_a_header_mismatch(method: str) -> None:
    routing = headers(method, "echo")

    assert mismatch(request("tools/call", name="echo"), routing).code == Code.HEADER_MISMATCH


def test_padded_header_values_are_accepted() -> None:
    routing = routing_of(
        [
            ("MCP-Protocol-Version", f" {VERSION}\t"),
            ("Mcp-Method", "\ttools/call "),
            ("Mcp-Name", "  echo  "),
        ]
    )

    assert check_headers(request("tools/call", name="echo"), META, routing) == "echo"


@pytest.mark.parametrize("name", ["echo", "héllo", "日本語ツール", " edge ", "=?base64?x?="])
def test_a_base64_encoded_name_matches_the_body(name: str) -> None:
    routing = headers("tools/call", b64(name))

    assert check_headers(request("tools/call", name=name), META, routing, strict=True) == name


def test_the_base64_form_does_not_apply_to_the_method_header() -> None:
    """The core allows it on Mcp-Name and Mcp-Param-* only: an intermediary routing on the
    literal Mcp-Method would see another method than the one taskgate checked."""
    error = mismatch(request("tools/list"), headers(b64("tools/list")))
    assert error.code == Code.HEADER_MISMATCH


@pytest.mark.parametrize("header", ["Echo", "echo2", "ech", b64("Echo"), "=?base64?ZWNobw?="])
def test_a_name_header_unlike_the_body_is_a_header_mismatch(header: str) -> None:
    routing = headers("tools/call", header)

    assert mismatch(request("tools/call", name="echo"), routing).code == Code.HEADER_MISMATCH


def test_a_malformed_name_header_is_a_header_mismatch_even_when_it_reads_like_the_body() -> None:
    body_name = "=?base64?%%%?="  # a conforming client would have encoded this name

    error = mismatch(request("tools/call", name=body_name), headers("tools/call", body_name))

    assert error.code == Code.HEADER_MISMATCH


def test_a_raw_non_ascii_name_header_is_a_header_mismatch() -> None:
    error = mismatch(request("tools/call", name="héllo"), headers("tools/call", "héllo"))

    assert error.code == Code.HEADER_MISMATCH


CORE_NAMED = [
    ("tools/call", {"name": "echo"}),
    ("prompts/get", {"name": "summarise"}),
    ("resources/read", {"uri": "file:///projects/myapp/config.json"}),
]
TASK_METHODS = ["tasks/get", "tasks/update", "tasks/cancel"]


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize(("method", "params"), CORE_NAMED)
def test_an_absent_name_header_is_a_header_mismatch_where_the_core_requires_it(
    method: str, params: dict[str, str], strict: bool
) -> None:
    error = mismatch(request(method, **params), headers(method), strict=strict)

    assert error.code == Code.HEADER_MISMATCH
    assert "Mcp-Name header is required" in error.message


@pytest.mark.parametrize("method", TASK_METHODS)
def test_an_absent_name_header_on_a_task_request_routes_on_the_body(method: str) -> None:
    assert check_headers(request(method, taskId="task-1"), META, headers(method)) == "task-1"


@pytest.mark.parametrize("method", TASK_METHODS)
def test_an_absent_name_header_on_a_task_request_is_a_header_mismatch_when_strict(
    method: str,
) -> None:
    error = mismatch(request(method, taskId="task-1"), headers(method), strict=True)

    assert error.code == Code.HEADER_MISMATCH


def test_a_method_the_core_does_not_name_needs_no_name_header_even_when_strict() -> None:
    assert check_headers(request("tools/list"), META, headers("tools/list"), strict=True) is None


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
def test_the_name_of_a_task_request_is_its_task_id(method: str) -> None:
    message = request(method, taskId="task-123", name="not-this")

    assert check_headers(message, META, headers(method, "task-123"), strict=True) == "task-123"
    assert mismatch(message, headers(method, "not-this")).code == Code.HEADER_MISMATCH
    assert mismatch(message, headers(method), strict=True).code == Code.HEADER_MISMATCH


def test_the_name_of_prompts_get_is_its_name() -> None:
    message = request("prompts/get", name="summarise")

    assert (
        check_headers(message, META, headers("prompts/get", "summarise"), strict=True)
        == "summarise"
    )
    assert mismatch(message, headers("prompts/get", "other")).code == Code.HEADER_MISMATCH


def test_the_name_of_resources_read_is_its_uri() -> None:
    uri = "file:///projects/myapp/config.json"
    message = request("resources/read", uri=uri, name="ignored")

    assert check_headers(message, META, headers("resources/read", uri), strict=True) == uri
    assert check_headers(message, META, headers("resources/read", b64(uri))) == uri
    assert mismatch(message, headers("resources/read", "ignored")).code == Code.HEADER_MISMATCH


@pytest.mark.parametrize("method", ["server/discover", "tools/list"])
def test_methods_without_a_name_param_have_no_routing_name(method: str) -> None:
    assert check_headers(request(method), META, headers(method), strict=True) is None


@pytest.mark.parametrize("value", [None, 7, ["echo"], {"n": "echo"}])
def test_a_body_name_that_is_not_a_string_gives_no_routing_name(value: Any) -> None:
    message = request("tools/call", name=value) if value is not None else request("tools/call")

    assert check_headers(message, META, headers("tools/call", "echo"), strict=True) is None
    # Without a name the header is not asked for: the method's own check names the bad param.
    assert check_headers(message, META, headers("tools/call")) is None


# --- the order: the version header, then the version, then the other headers -------------


def checked(body_version: str, routing: RoutingHeaders) -> str | None:
    meta = Meta(protocol_version=body_version, client_capabilities={})
    return check_headers(request("tools/call", name="echo"), meta, routing)


def test_a_version_header_unlike_an_unsupported_body_version_is_a_header_mismatch() -> None:
    with pytest.raises(HeaderError) as info:
        checked("2025-11-25", headers("tools/call", "echo", version=VERSION))

    assert info.value.code == Code.HEADER_MISMATCH
    assert info.value.data == {"header": "MCP-Protocol-Version"}


def test_an_unsupported_version_header_unlike_the_body_is_a_header_mismatch() -> None:
    with pytest.raises(HeaderError):
        checked(VERSION, headers("tools/call", "echo", version="2099-01-01"))


def test_a_missing_version_header_is_a_header_mismatch_whatever_the_body_version() -> None:
    with pytest.raises(HeaderError) as info:
        checked("2099-01-01", headers("tools/call", "echo", version=""))

    assert "MCP-Protocol-Version header is required" in info.value.message


def test_an_unsupported_version_both_name_is_refused_naming_the_supported_ones() -> None:
    with pytest.raises(VersionError) as info:
        checked("2099-01-01", headers("tools/call", "echo", version="2099-01-01"))

    assert info.value.code == Code.UNSUPPORTED_PROTOCOL_VERSION
    assert info.value.request_id == 3
    assert info.value.data == {"supported": [VERSION], "requested": "2099-01-01"}


def test_the_version_header_is_compared_as_sent_after_trimming() -> None:
    with pytest.raises(VersionError):
        checked("2099-01-01", headers("tools/call", "echo", version=" 2099-01-01\t"))
    # The base64 form is for Mcp-Name and Mcp-Param-* only.
    with pytest.raises(HeaderError):
        checked("2099-01-01", headers("tools/call", "echo", version=b64("2099-01-01")))


@pytest.mark.parametrize(
    "routing",
    [
        headers("tools/list", "echo", version="2099-01-01"),  # Mcp-Method disagrees
        headers("tools/call", version="2099-01-01"),  # Mcp-Name absent
        headers("tools/call", "other", version="2099-01-01"),  # Mcp-Name disagrees
    ],
)
def test_the_other_headers_are_checked_only_for_a_version_taskgate_serves(
    routing: RoutingHeaders,
) -> None:
    # Another revision may have other header rules; its client is told which versions to
    # retry with, and the 2026-07-28 rules apply to the retry.
    with pytest.raises(VersionError):
        checked("2099-01-01", routing)


def test_the_supported_versions_can_be_widened() -> None:
    meta = Meta(protocol_version="2099-01-01", client_capabilities={})
    routing = headers("tools/call", "echo", version="2099-01-01")

    assert (
        check_headers(
            request("tools/call", name="echo"), meta, routing, supported=(VERSION, "2099-01-01")
        )
        == "echo"
    )


# Every character class the two header checks tell apart: visible ASCII, space, tab, other
# controls, DEL, and beyond ASCII; a header's text may also hold a surrogate (header_text
# keeps stray bytes so), a body's value may not (orjson refuses lone surrogates).
_CLASSES = ["a", "~", "!", " ", "\t", "\x00", "\x1f", "\x7f", "é"]
_body_text = st.text(alphabet=st.sampled_from(_CLASSES), max_size=12)
_header_text = st.text(alphabet=st.sampled_from([*_CLASSES, "\udc80"]), max_size=12)


@given(value=_body_text)
def test_a_plain_value_is_verbatim_exactly_when_it_is_visible_ascii_with_inner_spaces(
    value: str,
) -> None:
    verbatim = encode_value(value) == value
    assert verbatim == (HEADER_SAFE.fullmatch(value) is not None and not value.startswith("=?"))


@given(value=_header_text)
def test_a_plain_value_decodes_exactly_when_it_holds_only_what_a_field_may(value: str) -> None:
    if value.strip(" \t").startswith("=?"):
        return  # the base64 form: the test above and the round trip cover it
    allowed = re.fullmatch(r"[\t\x20-\x7e]*", value.strip(" \t")) is not None
    assert (decode_value(value) is not None) == allowed
