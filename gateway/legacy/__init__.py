"""The 2025-era front door: clients that open with `initialize` and hold an `Mcp-Session-Id`
(revisions 2025-03-26, 2025-06-18, 2025-11-25) on the same endpoint as 2026-07-28 traffic.

taskgate owns the client's session (sessions.py, recorded in the store so that any instance
serves its next request), opens 2025-era sessions on backends lazily, one per backend
(upstreams.py), relays calls with the ids of server-to-client requests namespaced per backend
(wire.py), and merges what the client's GET stream owes it (stream.py); the handshake, the
lists and the order of a 2025-era request are gateway/pipeline/legacy.py's. Modern traffic
never enters this package: the era is decided by the body (gateway/protocol/era.py), in the
admission (gateway/pipeline/admission.py).
"""
