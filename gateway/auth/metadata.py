"""RFC 9728 Protected Resource Metadata and the WWW-Authenticate challenges that point to it."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from gateway.config import AuthConfig

WELL_KNOWN = "/.well-known/oauth-protected-resource"


def metadata_url(auth: AuthConfig) -> str:
    """Where clients fetch the metadata: configured, or derived from the resource (audience)
    as RFC 9728 section 3.1 does: https://host/.well-known/oauth-protected-resource/<path>."""
    if auth.resource_metadata.url:
        return auth.resource_metadata.url
    assert auth.audience is not None
    parts = urlsplit(auth.audience)
    path = WELL_KNOWN + parts.path.rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def document(auth: AuthConfig) -> dict[str, Any]:
    meta = auth.resource_metadata
    doc: dict[str, Any] = {"resource": auth.audience, "bearer_methods_supported": ["header"]}
    if meta.authorization_servers:
        doc["authorization_servers"] = list(meta.authorization_servers)
    if meta.scopes_supported:
        doc["scopes_supported"] = list(meta.scopes_supported)
    return doc


def challenge(url: str | None, *, error: str | None = None, scopes: tuple[str, ...] = ()) -> str:
    """A `Bearer` challenge naming the metadata URL (and the error and scopes, if any)."""
    parts = []
    if error:
        parts.append(f'error="{error}"')
    if scopes:
        parts.append(f'scope="{" ".join(scopes)}"')
    if url:
        parts.append(f'resource_metadata="{url}"')
    return "Bearer " + ", ".join(parts) if parts else "Bearer"
