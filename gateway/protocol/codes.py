"""JSON-RPC and MCP error codes, and the errors the sans-IO core raises."""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class Code(IntEnum):
    """Every JSON-RPC error code taskgate emits; -32020..-32022 are MCP 2026-07-28's."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    HEADER_MISMATCH = -32020
    MISSING_REQUIRED_CLIENT_CAPABILITY = -32021
    UNSUPPORTED_PROTOCOL_VERSION = -32022


RequestId = str | int


class ProtocolError(Exception):
    """A request the core refuses; the gateway's error table maps the class to an HTTP status."""

    code: Code = Code.INVALID_REQUEST

    def __init__(
        self,
        message: str,
        *,
        request_id: RequestId | None = None,
        data: Any = None,
        code: Code | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id
        self.data = data
        if code is not None:
            self.code = code


class EnvelopeError(ProtocolError):
    """The bytes are not one well-formed JSON-RPC request or notification (-32700 / -32600)."""


class MetaError(ProtocolError):
    """A required `_meta` key is missing or has the wrong shape (-32602)."""

    code = Code.INVALID_PARAMS


class VersionError(ProtocolError):
    """The request names a protocol version taskgate does not serve (-32022)."""

    code = Code.UNSUPPORTED_PROTOCOL_VERSION


class HeaderError(ProtocolError):
    """An MCP header is missing, duplicated, malformed or disagrees with the body (-32020)."""

    code = Code.HEADER_MISMATCH


class MethodError(ProtocolError):
    """The method is not one taskgate serves (-32601)."""

    code = Code.METHOD_NOT_FOUND


class CapabilityError(ProtocolError):
    """The request needs a client capability it did not declare (-32021)."""

    code = Code.MISSING_REQUIRED_CLIENT_CAPABILITY
