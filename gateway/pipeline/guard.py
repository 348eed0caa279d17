"""Origin and Host checks against DNS rebinding, on the public and the admin listener."""

from __future__ import annotations

from urllib.parse import urlsplit

from gateway.config import AdminConfig, ListenConfig
from gateway.config.loopback import is_loopback


class Guard:
    """Decides, from a listener's configuration (`listen`, or `admin`: both name their
    `host`, `allowed_origins` and `allowed_hosts` alike), which Origin and Host values may
    call."""

    def __init__(self, listen: ListenConfig | AdminConfig) -> None:
        self._any_origin = "*" in listen.allowed_origins
        self._origins = frozenset(o.rstrip("/").lower() for o in listen.allowed_origins)
        self._hosts = frozenset(h.lower() for h in listen.allowed_hosts)
        self._check_host = is_loopback(listen.host)
        # Host value -> whether it passes: clients send the same few, so each is judged once;
        # the bound keeps odd clients from growing it.
        self._judged: dict[str, bool] = {}

    def origin_allowed(self, origin: str | None) -> bool:
        """No Origin (not a browser) and loopback origins pass; others must be configured."""
        if origin is None or self._any_origin:
            return True
        normalised = origin.strip().rstrip("/").lower()
        if normalised in self._origins:
            return True
        try:
            parts = urlsplit(normalised)
        except ValueError:  # e.g. "http://[::1" or "http://[name]": not an origin at all
            return False
        return parts.scheme in ("http", "https") and is_loopback(parts.hostname or "")

    def host_allowed(self, host: str | None) -> bool:
        """On a loopback listener, a non-loopback Host means a rebound DNS name: refuse it."""
        if not self._check_host or host is None:
            return True
        allowed = self._judged.get(host)
        if allowed is None:
            name = _hostname(host)
            allowed = is_loopback(name) or name in self._hosts or host.lower() in self._hosts
            if len(self._judged) < _JUDGED_MEMO:
                self._judged[host] = allowed
        return allowed


_JUDGED_MEMO = 256


def _hostname(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
