"""MCP routing headers: the `=?base64?...?=` value form and the comparison with the body."""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from typing import Final, Protocol

from gateway.protocol.codes import HeaderError
from gateway.protocol.envelope import RPCRequest
from gateway.protocol.meta import SUPPORTED_VERSIONS, Meta, check_version
from gateway.protocol.methods import NAME_PARAMS

PROTOCOL_VERSION = "mcp-protocol-version"
METHOD = "mcp-method"
NAME = "mcp-name"
PARAM_PREFIX = "mcp-param-"

_ROUTING = (PROTOCOL_VERSION, METHOD, NAME)
# The core (basic/transports/streamable-http; docs/architecture.md, Sources): a value "matches
# the sentinel pattern" when it starts with =?base64? and ends with ?=.
_PREFIX = "=?base64?"
_SUFFIX = "?="
# What RFC 9110 allows in a plain field value: visible ASCII, space and horizontal tab.
_PLAIN = re.compile(r"[\t\x20-\x7e]*")
_OWS = " \t"
# Where an absent Mcp-Name passes unless `strict`: the Tasks extension's tasks/*, which real
# clients send without it (FastMCP's does; docs/decisions.md, 2). The core's name-bearing methods
# (tools/call, prompts/get, resources/read) and any method added to NAME_PARAMS later always
# require the header.
_NAME_OPTIONAL = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})


def _safe(value: str) -> bool:
    """Whether a value may travel as it is: visible ASCII (0x21-0x7e) with spaces (0x20) only
    inside it; tests/unit/test_headers.py holds this to that rule as a regex. By str methods:
    a regex match per header costs more than the rest of the header checks (on ASCII,
    isprintable is exactly 0x20-0x7e)."""
    return value.isascii() and value.isprintable() and value[0] != " " and value[-1] != " "


def _plain(value: str) -> bool:
    """_PLAIN.fullmatch(value): by str methods for the usual value, the regex for one with a
    tab or anything else."""
    if value.isascii() and value.isprintable():
        return True
    return _PLAIN.fullmatch(value) is not None


def _looks_like_sentinel(value: str) -> bool:
    return value.startswith(_PREFIX) and value.endswith(_SUFFIX)


def encode_value(value: str) -> str:
    """The header form of `value`: verbatim when it is safe ASCII, else the base64 form."""
    if value and _safe(value) and not _looks_like_sentinel(value):
        return value
    return f"=?base64?{base64.b64encode(value.encode()).decode('ascii')}?="


def decode_value(raw: str) -> str | None:
    """The value a header carries after OWS trimming and base64 decoding; None if malformed."""
    value = raw.strip(_OWS)
    if not _looks_like_sentinel(value):
        # A plain value with characters a header may not carry is malformed, not compared.
        return value if _plain(value) else None
    if len(value) < len(_PREFIX) + len(_SUFFIX):
        return None  # "=?base64?=": the markers overlap, so there is no payload
    payload = value[len(_PREFIX) : -len(_SUFFIX)]
    try:
        decoded = base64.b64decode(payload, validate=True)
        # A canonical encoding only: two spellings of one value must not both pass a check.
        if base64.b64encode(decoded).decode("ascii") != payload:
            return None
        return decoded.decode("utf-8")
    except ValueError:  # binascii.Error, UnicodeDecodeError, and non-ASCII payload text
        return None


def _plain_value(raw: str) -> str | None:
    value = raw.strip(_OWS)
    return value if _plain(value) else None


class HeaderLookup(Protocol):
    """Every value of a header by its case-insensitive name, as a multidict's getall."""

    def getall(self, key: str, default: tuple[()], /) -> Sequence[str] | tuple[()]: ...


class RoutingHeaders:
    """Every value of the three routing headers, so that duplicates are visible. A plain class
    made per request, as envelope's messages are (why: there)."""

    __slots__ = ("method", "name", "protocol_version")

    def __init__(
        self,
        protocol_version: tuple[str, ...] = (),
        method: tuple[str, ...] = (),
        name: tuple[str, ...] = (),
    ) -> None:
        self.protocol_version: Final = protocol_version
        self.method: Final = method
        self.name: Final = name

    @classmethod
    def of(cls, headers: HeaderLookup) -> RoutingHeaders:
        """From case-insensitive request headers (the listener's, or a multidict): three
        lookups. (The class by name, its arguments in order: compiled, that is a direct call
        of the constructor, where `cls(...)` with keywords goes through Python's.)"""
        return RoutingHeaders(
            tuple(headers.getall(PROTOCOL_VERSION, ())),
            tuple(headers.getall(METHOD, ())),
            tuple(headers.getall(NAME, ())),
        )


def check_headers(
    request: RPCRequest,
    meta: Meta,
    headers: RoutingHeaders,
    *,
    strict: bool = False,
    supported: tuple[str, ...] = SUPPORTED_VERSIONS,
) -> str | None:
    """Check the headers against the body (which is authoritative), and the version they
    agree on; return the routing name.

    In this order: MCP-Protocol-Version against the body's version (HeaderError, -32020, so
    a request that disagrees with itself is told so even when the body's version is
    unsupported); the version both name (VersionError, -32022); then Mcp-Method and
    Mcp-Name, which are rules of the version taskgate serves (HeaderError, -32020, on a
    missing, duplicated, malformed or disagreeing header). Mcp-Name is required where the
    core names it; an absent one passes on tasks/* unless `strict`.
    """
    _expect(
        "MCP-Protocol-Version", headers.protocol_version, meta.protocol_version, request, plain=True
    )
    check_version(meta, request, supported)
    _expect("Mcp-Method", headers.method, request.method, request, plain=True)
    param = NAME_PARAMS.get(request.method)
    if param is None:
        return None
    body_value = request.params.get(param)
    if not isinstance(body_value, str):
        # Nothing to route on; the method's own validation names the bad param.
        return None
    if not headers.name and not strict and request.method in _NAME_OPTIONAL:
        return body_value
    _expect("Mcp-Name", headers.name, body_value, request)
    return body_value


def _expect(
    label: str,
    values: tuple[str, ...],
    body_value: str,
    request: RPCRequest,
    *,
    plain: bool = False,
) -> None:
    """`plain`: a header the base64 form does not apply to (the core allows it on Mcp-Name and
    Mcp-Param-* only), compared as sent after OWS trimming: an intermediary routing on the
    literal value must see what taskgate validated."""
    if not values:
        raise HeaderError(f"Header mismatch: the {label} header is required", request_id=request.id)
    if len(values) > 1:
        raise HeaderError(
            f"Header mismatch: the {label} header appears {len(values)} times",
            request_id=request.id,
        )
    decoded = decode_value(values[0]) if not plain else _plain_value(values[0])
    if decoded is None:
        raise HeaderError(
            f"Header mismatch: the {label} header is malformed (a character a header may not "
            "carry, or a bad =?base64?...?= value)",
            request_id=request.id,
        )
    if decoded != body_value:
        raise HeaderError(
            f"Header mismatch: the {label} header does not match the body",
            request_id=request.id,
            data={"header": label},
        )
