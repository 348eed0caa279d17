"""The per-request `_meta` envelope of 2026-07-28: protocol version and client capabilities."""

from __future__ import annotations

from typing import Any, Final

from gateway.protocol.codes import CapabilityError, MetaError, VersionError
from gateway.protocol.envelope import RPCRequest

PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID_KEY = "io.modelcontextprotocol/subscriptionId"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"

# The revisions taskgate speaks; the pinned 2025-11-25 adapter will not be listed here.
SUPPORTED_VERSIONS: tuple[str, ...] = ("2026-07-28",)


class Meta:
    """What every request must declare about itself. A plain class made per request, as
    envelope's messages are (why: there)."""

    __slots__ = ("client_capabilities", "protocol_version")

    def __init__(self, protocol_version: str, client_capabilities: dict[str, Any]) -> None:
        self.protocol_version: Final = protocol_version
        self.client_capabilities: Final = client_capabilities

    def has_extension(self, identifier: str) -> bool:
        extensions = self.client_capabilities.get("extensions")
        return isinstance(extensions, dict) and isinstance(extensions.get(identifier), dict)


def read_meta(request: RPCRequest) -> Meta:
    """The request's required `_meta` keys, or MetaError (-32602) naming what is missing."""
    meta = request.params.get("_meta")
    if request.method == "initialize" and not isinstance(meta, dict):
        # The 2025 handshake: name the revision taskgate serves (the core, basic/versioning:
        # a modern-only server SHOULD name its versions in any error to initialize).
        raise MetaError(
            "Invalid params: initialize is the 2025 handshake; taskgate serves MCP "
            f"{', '.join(SUPPORTED_VERSIONS)} only, where each request carries params._meta "
            f"with {PROTOCOL_VERSION_KEY!r} (start with server/discover)",
            request_id=request.id,
            data={"supported": list(SUPPORTED_VERSIONS)},
        )
    if not isinstance(meta, dict):
        raise MetaError(
            f"Invalid params: params._meta must be an object carrying {PROTOCOL_VERSION_KEY!r} "
            f"and {CLIENT_CAPABILITIES_KEY!r} (MCP 2026-07-28); a client of the 2025 era "
            "opens with initialize and then sends its Mcp-Session-Id",
            request_id=request.id,
        )
    missing = [key for key in (PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY) if key not in meta]
    if missing:
        raise MetaError(
            f"Invalid params: params._meta is missing {', '.join(map(repr, missing))}",
            request_id=request.id,
        )
    version = meta[PROTOCOL_VERSION_KEY]
    if not isinstance(version, str):
        raise MetaError(
            f"Invalid params: params._meta[{PROTOCOL_VERSION_KEY!r}] must be a string",
            request_id=request.id,
        )
    capabilities = meta[CLIENT_CAPABILITIES_KEY]
    if not isinstance(capabilities, dict):
        raise MetaError(
            f"Invalid params: params._meta[{CLIENT_CAPABILITIES_KEY!r}] must be an object",
            request_id=request.id,
        )
    return Meta(protocol_version=version, client_capabilities=capabilities)


def check_version(
    meta: Meta, request: RPCRequest, supported: tuple[str, ...] = SUPPORTED_VERSIONS
) -> None:
    """Refuse a version taskgate does not serve with the data a client needs to retry (-32022)."""
    if meta.protocol_version not in supported:
        raise VersionError(
            f"Unsupported protocol version: {meta.protocol_version!r}",
            request_id=request.id,
            data={"supported": list(supported), "requested": meta.protocol_version},
        )


def require_extension(meta: Meta, request: RPCRequest, identifier: str) -> None:
    """Refuse a request that needs an extension its `_meta` does not declare (-32021)."""
    if not meta.has_extension(identifier):
        raise CapabilityError(
            f"Missing required client capability: {request.method} needs the {identifier} "
            "extension declared in params._meta clientCapabilities.extensions",
            request_id=request.id,
            data={"requiredCapabilities": {"extensions": {identifier: {}}}},
        )
