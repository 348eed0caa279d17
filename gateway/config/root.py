"""The whole configuration file: its sections, the checks across them, its JSON Schema."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field

from gateway.config.auth import AuthConfig
from gateway.config.backends import BackendConfig, HealthConfig
from gateway.config.legacy import LegacyConfig
from gateway.config.limits import LimitsConfig, PrincipalAllowance
from gateway.config.listen import AdminConfig, ListenConfig
from gateway.config.loopback import is_loopback
from gateway.config.observe import LoggingConfig, TracingConfig
from gateway.config.routes import DiscoveryConfig, RouteConfig
from gateway.config.section import Section
from gateway.config.store import StoreConfig, TasksConfig
from gateway.config.subscriptions import SubscriptionsConfig

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


class Config(Section):
    """The whole taskgate configuration file."""

    listen: ListenConfig = ListenConfig()
    store: StoreConfig = StoreConfig()
    auth: AuthConfig = AuthConfig()
    tasks: TasksConfig = TasksConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    health: HealthConfig = HealthConfig()
    subscriptions: SubscriptionsConfig = SubscriptionsConfig()
    admin: AdminConfig | None = None
    logging: LoggingConfig = LoggingConfig()
    tracing: TracingConfig = TracingConfig()
    legacy: LegacyConfig = LegacyConfig()
    limits: LimitsConfig = LimitsConfig()
    backends: dict[str, BackendConfig] = Field(min_length=1)
    routes: tuple[RouteConfig, ...] = Field(min_length=1)

    @property
    def tenant_share(self) -> float:
        """The share the coordinator applies: limits.tenant_share (or the deprecated
        listen.tenant_share; 0.5), but none with auth mode none, where every request is the one
        anonymous caller and a share would only halve the process (docs/decisions.md, 35)."""
        if self.auth.mode == "none":
            return 1.0
        share = self.limits.tenant_share or self.listen.tenant_share
        return DEFAULT_TENANT_SHARE if share is None else share

    def principal_defaults(self) -> PrincipalAllowance:
        """limits.principal, where it is silent taking the deprecated keys it replaced."""
        principal = self.limits.principal
        said = principal.model_fields_set
        moved = {
            new: old
            for new, old in (
                ("listen_streams", self.subscriptions.max_streams_per_principal),
                ("session_streams", self.legacy.max_streams_per_principal),
                ("sessions", self.legacy.max_sessions_per_principal),
            )
            if old is not None and new not in said
        }
        return principal.model_copy(update=moved) if moved else principal


DEFAULT_TENANT_SHARE = 0.5
# The keys the limits section replaced, and where each went (`taskgate check` warns of them).
DEPRECATED = {
    ("listen", "tenant_share"): "limits.tenant_share",
    ("subscriptions", "max_streams_per_principal"): "limits.principal.listen_streams",
    ("legacy", "max_streams_per_principal"): "limits.principal.session_streams",
    ("legacy", "max_sessions_per_principal"): "limits.principal.sessions",
}


def deprecation_warnings(config: Config) -> list[str]:
    """The deprecated keys the file sets, each with the key that replaces it."""
    return [
        f"{section}.{key} is deprecated: use {new}"
        for (section, key), new in DEPRECATED.items()
        if getattr(getattr(config, section), key) is not None
    ]


def cross_check(config: Config) -> list[str]:
    """Mistakes no one section sees: backend names, the admin port on the public one, auth
    mode none off loopback, routes naming an unknown backend."""
    problems = [
        f"backends.{name}: backend names use letters, digits, '_', '.', '-'"
        for name in config.backends
        if not _NAME.fullmatch(name)
    ]
    admin = config.admin
    if admin is not None and admin.port == config.listen.port and admin.port != 0:
        problems.append(f"admin.port: {admin.port} is the public listener's port too")
    if config.auth.mode == "none" and not is_loopback(config.listen.host):
        problems.append(
            "auth.mode: none is for local development: listen.host must be loopback "
            "(127.0.0.1, ::1 or localhost); configure mode: jwt to listen elsewhere"
        )
    return problems + unknown_backends(config.model_dump())


def unknown_backends(data: dict[str, Any]) -> list[str]:
    """Routes naming a backend that is not configured; works on raw YAML data too."""
    backends = data.get("backends")
    routes = data.get("routes")
    if not isinstance(backends, dict) or not isinstance(routes, list | tuple):
        return []
    return [
        f"routes[{index}].backend: unknown backend {route['backend']!r}"
        for index, route in enumerate(routes)
        if isinstance(route, dict)
        and isinstance(route.get("backend"), str)
        and route["backend"] not in backends
    ]


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the configuration file, for editors and for config/schema.json."""
    schema = Config.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "taskgate configuration"
    return schema
