"""YAML configuration: frozen pydantic models, cross-checks, errors that name the YAML path.

One module per section of the file (listen and admin, store and tasks, auth, backends and
health, routes and discovery, subscriptions, legacy, limits, logging and tracing), the whole file in
`root`, reading it in `load`. The names below are the package's public face: the rest of
taskgate imports them from `gateway.config`.
"""

from __future__ import annotations

from gateway.config.auth import AuthConfig, KeyConfig, ResourceMetadataConfig
from gateway.config.backends import (
    BackendConfig,
    HealthConfig,
    IdentityHeadersConfig,
    UpstreamAuthConfig,
)
from gateway.config.errors import ConfigError
from gateway.config.legacy import LegacyConfig
from gateway.config.limits import LimitsConfig, PollingConfig, PrincipalAllowance
from gateway.config.listen import AdminConfig, ListenConfig
from gateway.config.load import load_config, parse_config
from gateway.config.observe import LoggingConfig, TracingConfig
from gateway.config.root import Config, deprecation_warnings, json_schema
from gateway.config.routes import ROUTE_KINDS, DiscoveryConfig, RouteConfig, RouteTasksConfig
from gateway.config.store import (
    MadeTasksConfig,
    StoreConfig,
    StoreTLSConfig,
    TasksConfig,
    sqlite_path,
)
from gateway.config.subscriptions import SubscriptionsConfig

__all__ = [
    "ROUTE_KINDS",
    "AdminConfig",
    "AuthConfig",
    "BackendConfig",
    "Config",
    "ConfigError",
    "DiscoveryConfig",
    "HealthConfig",
    "IdentityHeadersConfig",
    "KeyConfig",
    "LegacyConfig",
    "LimitsConfig",
    "ListenConfig",
    "LoggingConfig",
    "MadeTasksConfig",
    "PollingConfig",
    "PrincipalAllowance",
    "ResourceMetadataConfig",
    "RouteConfig",
    "RouteTasksConfig",
    "StoreConfig",
    "StoreTLSConfig",
    "SubscriptionsConfig",
    "TasksConfig",
    "TracingConfig",
    "UpstreamAuthConfig",
    "deprecation_warnings",
    "json_schema",
    "load_config",
    "parse_config",
    "sqlite_path",
]
