"""The Accept rule: what taskgate admits is what the backends admit, weights aside."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.server.streamable_http import check_accept_headers
from starlette.requests import Request

from gateway.protocol import accept
from gateway.protocol.accept import acceptable, admits
from gateway.upstream.relay import upstream_headers


@pytest.mark.parametrize(
    "value",
    [
        "application/json, text/event-stream",
        "text/event-stream,application/json",
        "*/*",
        "application/*, text/*",
        "APPLICATION/JSON, Text/Event-Stream",
        "application/json; charset=utf-8, text/event-stream;q=0.5",
        "*/*;q=0.1",
        "text/html, application/json, image/png, text/event-stream",
        " \tapplication/json ,\ttext/event-stream ",
        "application/json;q=1.0, text/event-stream;q=1",
        "application/*;q=0, application/json, text/*",  # the exact type outranks the wildcard
        "application/json;q=abc, text/event-stream;q=2",  # a weight that is no qvalue is ignored
        "application/json, text/event-stream;Q=0.001",
    ],
)
def test_these_accept_values_admit(value: str) -> None:
    assert admits(value)


@pytest.mark.parametrize(
    "value",
    [
        "application/json",  # the measured case: FastMCP answers 406
        "text/event-stream",
        "",
        " , ",
        "text/html",
        "application/json, text/event-stream;q=0",
        "application/json;q=0.000, text/event-stream",
        "*/*;q=0",
        "text/event-stream;q=0, */*",  # the exact type's q=0 outranks the wildcard
        "*/*, application/json;q=0",
        "application/*, text/html",
        "application/json-seq, text/event-streams",
        "application/json text/event-stream",  # one token, not two
    ],
)
def test_these_accept_values_do_not(value: str) -> None:
    assert not admits(value)


def test_several_accept_lines_combine_as_one_list() -> None:
    assert acceptable(["application/json", "text/event-stream"])
    assert acceptable(["text/html", "*/*"])
    assert not acceptable(["application/json", "text/html"])
    assert not acceptable(["application/json, */*", "text/event-stream;q=0"])


def test_several_accept_lines_go_upstream_as_one_since_a_backend_reads_only_the_first() -> None:
    raw = [
        (b"Accept", b"application/json"),
        (b"Content-Type", b"application/json"),
        (b"accept", b"text/event-stream"),
        (b"ACCEPT", b"text/html;q=0.1"),
    ]
    block = upstream_headers(raw, name=None, extra={})
    assert block == (
        b"Accept: application/json, text/event-stream, text/html;q=0.1\r\n"
        b"Content-Type: application/json\r\n"
    )
    assert _sdk_admits(block.split(b"\r\n")[0].partition(b": ")[2].decode())


def test_the_memo_of_verdicts_stays_bounded_and_right() -> None:
    values = [f"application/json, text/x-{n}" for n in range(3 * accept._VERDICTS_MEMO)]
    assert not any(acceptable([value]) for value in values)
    assert len(accept._verdicts) <= accept._VERDICTS_MEMO
    late = "text/event-stream, application/json, text/x-late"
    assert acceptable([late])
    assert acceptable([late])  # the same answer whether it was remembered or not


def _sdk_admits(value: str) -> bool:
    """What the backends (the MCP SDK under FastMCP 4.1.4) admit before they read a body."""
    scope = {"type": "http", "headers": [(b"accept", value.encode("latin-1"))]}
    has_json, has_sse = check_accept_headers(Request(scope))
    return has_json and has_sse


_ranges = st.sampled_from(
    [
        "application/json",
        "text/event-stream",
        "*/*",
        "application/*",
        "text/*",
        "text/html",
        "application/xml",
        "image/*",
        "",
    ]
)
_parameters = st.sampled_from(["", ";charset=utf-8", " ; level=1", ";q=0.5", ";q=1", ";q=0"])
_elements = st.tuples(_ranges, _parameters, st.booleans()).map(
    lambda parts: (parts[0].upper() if parts[2] else parts[0]) + parts[1]
)
_values = st.tuples(st.lists(_elements, max_size=6), st.sampled_from([",", ", ", " ,\t"])).map(
    lambda parts: parts[1].join(parts[0])
)


@settings(max_examples=500, deadline=None)
@given(value=_values)
def test_taskgate_admits_what_the_sdk_admits_and_only_weights_make_it_stricter(
    value: str,
) -> None:
    if "q=0" in value.replace("q=0.5", ""):
        assert not admits(value) or _sdk_admits(value)
    else:
        assert admits(value) == _sdk_admits(value)


@settings(max_examples=300, deadline=None)
@given(value=st.text(max_size=80))
def test_any_text_gets_a_verdict(value: str) -> None:
    assert admits(value) in (True, False)
