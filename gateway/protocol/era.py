"""Which era a request on the MCP path is of, told from its bytes before any parse.

Every 2026-07-28 request carries its version in params._meta; no 2025-era request does. A body
without that key's bytes that names a session, is a batch, an initialize or a posted response
is of the 2025 era; any other body goes on to the modern checks, which name what it lacks. The
one case the bytes cannot settle (a 2025-era body that mentions the key in a string) is settled
by the modern parse, which raises LegacyAfterAll for it.
"""

from __future__ import annotations

from gateway.protocol.meta import PROTOCOL_VERSION_KEY

# The 2025 era's session header (a 2026-07-28 request never carries one).
SESSION_HEADER = "Mcp-Session-Id"
# The revisions of the 2025 era, oldest first, and the header that names the revision of a
# session's requests from 2025-06-18 on.
LEGACY_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
VERSION_HEADER = "MCP-Protocol-Version"

# Looking for these bytes costs one memmem on the modern hot path. (bytes.find, not `in`:
# CPython's bytes.__contains__ tries the argument as an int first, and formats and drops a
# TypeError each time it is not one.)
_MODERN_MARK = PROTOCOL_VERSION_KEY.encode()


def is_modern(body: bytes) -> bool:
    """Whether `body` may be a 2026-07-28 request (the parse decides for certain)."""
    return body.find(_MODERN_MARK) >= 0


def looks_legacy(session: str | None, body: bytes) -> bool:
    """Whether a body without the modern version is of the 2025 era: a session header
    (`session`), a batch, initialize, or a posted response."""
    if session is not None or body.lstrip()[:1] == b"[":
        return True
    if b'"initialize"' in body:
        return True
    return b'"method"' not in body and (b'"result"' in body or b'"error"' in body)


class LegacyAfterAll(Exception):
    """Raised by the modern pipeline for a body that parsed, names a session and declares no
    version in its _meta: a 2025-era request after all. `refused` is the modern answer, for
    when the 2025-era front door is off."""

    def __init__(self, refused: Exception) -> None:
        super().__init__(str(refused))
        self.refused = refused


def legacy_headers(session_id: str, version: str) -> dict[str, str]:
    """The headers of a request on a 2025-era session: its id (none on a stateless server,
    which assigns none), and its revision from 2025-06-18 on (2025-03-26 has no such header)."""
    headers = {SESSION_HEADER: session_id} if session_id else {}
    if version != LEGACY_VERSIONS[0]:
        headers[VERSION_HEADER] = version
    return headers
