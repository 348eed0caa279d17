"""What the backends' discover results say they serve, and so what taskgate's own
server/discover advertises: the versions all of them speak, the capabilities a routed backend
serves end to end, the Tasks extension; and whether a backend may push task changes."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from gateway.catalog.table import RouteTable
from gateway.catalog.views import LIST_KINDS, BackendView
from gateway.protocol.meta import SUPPORTED_VERSIONS, TASKS_EXTENSION


def common_versions(views: Collection[BackendView]) -> list[str]:
    """The protocol versions taskgate supports that every backend answering speaks."""
    return [v for v in SUPPORTED_VERSIONS if all(_speaks(view, v) for view in views)]


def advertised(found: Mapping[str, BackendView], table: RouteTable) -> dict[str, Any]:
    """The `capabilities` of taskgate's server/discover result, from the backends that
    answered (`found`) and what the routes name on them."""
    extensions: dict[str, Any] = {}
    if any(TASKS_EXTENSION in _extensions(view) for view in found.values()):
        extensions[TASKS_EXTENSION] = {}
    # Only what taskgate honours end to end: prompts (list, get), resources (both lists and
    # resources/read), completions (completion/complete routed by its ref), each when a
    # routed backend serves it; `listChanged` on each, since subscriptions/listen emulates
    # list_changed for every backend (gateway/listen/lists.py). `subscribe` only when a
    # routed backend that serves resources says it pushes resources/updated: taskgate
    # relays them over upstream listens and cannot emulate them (gateway/listen/
    # upstream.py). The SDK's MCPServer says so (`subscribe: true` at 2026-07-28, where it
    # means it serves subscriptions/listen); FastMCP 4.1.4 says `subscribe: false`.
    capabilities: dict[str, Any] = {"tools": {"listChanged": True}}
    if serves(found, table, "prompts"):
        capabilities["prompts"] = {"listChanged": True}
    if serves(found, table, "resources"):
        capabilities["resources"] = {"listChanged": True}
        if serves_subscribe(found, table):
            capabilities["resources"]["subscribe"] = True
    if serves_completions(found, table):
        capabilities["completions"] = {}
    if extensions:
        capabilities["extensions"] = extensions
    return capabilities


def serves(views: Mapping[str, BackendView], table: RouteTable, capability: str) -> bool:
    """Whether a backend in `views` advertises `capability` and a route names items of that
    kind on it (prompts; resources or resource_templates)."""
    kinds = [kind for kind in LIST_KINDS if kind.capability == capability]
    routed = {
        route.backend
        for route in table.routes
        if any(getattr(route, kind.route_field) for kind in kinds)
    }
    return any(advertises(views[name].discover, capability) for name in routed if name in views)


def serves_subscribe(views: Mapping[str, BackendView], table: RouteTable) -> bool:
    """Whether a backend a route names resources or templates on advertises resources
    with a truthy `subscribe`."""
    routed = {
        route.backend for route in table.routes if route.resources or route.resource_templates
    }
    return any(_subscribes(views[name].discover) for name in routed if name in views)


def serves_completions(views: Mapping[str, BackendView], table: RouteTable) -> bool:
    """Whether a backend that a route names prompts or resource templates on advertises
    `completions`: completion/complete reaches only those refs."""
    routed = {route.backend for route in table.routes if route.prompts or route.resource_templates}
    return any(advertises(views[name].discover, "completions") for name in routed if name in views)


def advertises(discover: dict[str, Any], capability: str) -> bool:
    """Whether a discover result advertises `capability`."""
    capabilities = discover.get("capabilities")
    # Present and not null/false: the core's shape is an object, but `true` is read as a yes.
    return isinstance(capabilities, dict) and capabilities.get(capability) not in (None, False)


def _subscribes(discover: dict[str, Any]) -> bool:
    capabilities = discover.get("capabilities")
    resources = capabilities.get("resources") if isinstance(capabilities, dict) else None
    return isinstance(resources, dict) and bool(resources.get("subscribe"))


def declares_tasks(view: BackendView) -> bool:
    """Whether a 2026-07-28 backend declares the Tasks extension (it runs tasks itself)."""
    return TASKS_EXTENSION in _extensions(view)


def may_push_tasks(view: BackendView) -> bool:
    """Whether a backend may push notifications/tasks on a listen: it declares the Tasks
    extension and says it serves subscriptions/listen. The core has no capability for the
    latter; a server that serves it says `listChanged: true` or `resources.subscribe: true`
    (the MCP SDK's MCPServer does), one that does not says neither (FastMCP 4.1.4). A backend
    this misjudges is polled, which is always correct, or asked once in vain."""
    if not declares_tasks(view):
        return False
    capabilities = view.discover.get("capabilities")
    if not isinstance(capabilities, dict):
        return False
    return any(
        isinstance(entry, dict)
        and (entry.get("listChanged") is True or entry.get("subscribe") is True)
        for entry in capabilities.values()
    )


def _speaks(view: BackendView, version: str) -> bool:
    versions = view.discover.get("supportedVersions")
    return not isinstance(versions, list) or version in versions


def _extensions(view: BackendView) -> dict[str, Any]:
    capabilities = view.discover.get("capabilities")
    if isinstance(capabilities, dict) and isinstance(capabilities.get("extensions"), dict):
        return capabilities["extensions"]  # type: ignore[no-any-return]
    return {}
