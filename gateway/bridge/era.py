"""Which era a backend's replica speaks: configured (`backends.X.era`), or learned by asking.

Learning follows the core's era probe: taskgate asks `server/discover` in 2026-07-28; an answer
(HTTP 4xx, or a JSON-RPC error) that is not one only a 2026-07-28 server gives may come from a
2025-era server (the Python SDK 1.x says "Missing session ID" or "Unsupported protocol version",
the TypeScript SDK 1.x "No valid session ID provided" or "Method not found"), and taskgate then
tries `initialize`. A server that accepts it speaks the 2025 era; one that refuses both keeps
the discover failure. Not reaching the replica decides nothing. A dual-era server answers
discover, and is spoken to in 2026-07-28.
"""

from __future__ import annotations

from typing import Final, Literal

from gateway.protocol.meta import SUPPORTED_VERSIONS
from gateway.upstream.calls import UpstreamCallError, UpstreamRPCError

# What `backends.X.era` may say.
EraSetting = Literal["auto", "2026-07-28", "2025"]
MODERN: Final = SUPPORTED_VERSIONS[0]

# Refusals of a modern request that only a server of 2026-07-28 gives: a header that does not
# match the body, a capability the request did not declare, a version it does not support.
_MODERN_REFUSALS = frozenset({-32020, -32021, -32022})


def may_be_2025(refused: UpstreamCallError) -> bool:
    """Whether a failed server/discover may come from a 2025-era server: the replica answered
    (not with a refusal of the caller's credentials, its load or its own failure), and not with
    one of the modern core's own refusals."""
    status = refused.status
    if status is None or status in (401, 403, 429) or status >= 500:
        return False
    return not (isinstance(refused, UpstreamRPCError) and refused.code in _MODERN_REFUSALS)
