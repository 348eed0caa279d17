"""How the operator's commands (`taskgate reload`, `taskgate task inspect --admin`) reach a
running taskgate's admin listener from the configuration file."""

from __future__ import annotations

import os

from gateway.config import AdminConfig

# The admin listener refuses a POST without this header (gateway/ops/admin.py): a browser cannot
# send a custom header cross-site without a CORS preflight, which the admin listener never
# grants, so a web page the operator opens cannot reload taskgate.
ADMIN_HEADER = "X-Taskgate-Admin"

# A listener on every address is asked on this machine's loopback.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def admin_base(admin: AdminConfig) -> str | None:
    """`http://host:port` of the admin listener, or None when its port is chosen at start
    (`admin.port: 0`), which no other process can know."""
    if admin.port == 0:
        return None
    host = _WILDCARDS.get(admin.host, admin.host)
    return f"http://{f'[{host}]' if ':' in host else host}:{admin.port}"


def admin_headers(admin: AdminConfig) -> dict[str, str]:
    """The header a POST needs, and the admin's bearer token, from the variable
    `admin.bearer_env` names, when set here."""
    token = os.environ.get(admin.bearer_env) if admin.bearer_env is not None else None
    headers = {ADMIN_HEADER: "1"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers
