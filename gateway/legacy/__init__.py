"""The 2025-era front door: clients that open with `initialize` and hold an `Mcp-Session-Id`
(revisions 2025-03-26, 2025-06-18, 2025-11-25) on the same endpoint as 2026-07-28 traffic.

taskgate owns the client's session (gateway/legacy/sessions.py, recorded in the route store so
that any instance serves its next request), opens 2025-era sessions on backends lazily, one per
backend (upstreams.py), answers the handshake and the lists itself (front.py), relays calls with
the ids of server-to-client requests namespaced per backend (wire.py), and merges what the
client's GET stream owes it (stream.py). Modern traffic never enters this package: the era is
decided by the body (wire.is_modern).
"""
