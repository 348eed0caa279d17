"""What taskgate keeps of one backend as last seen (BackendView), and the lists it reads of it:
tools/list and the optional ones (ListKind), each with how its items are named and routed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.catalog.table import Route, RouteTable


@dataclass(frozen=True, slots=True)
class BackendView:
    """One backend as last seen: its discover result, its tools and prompts by name, its
    resources by uri, its resource templates by uriTemplate; each item as the backend sent it
    (what each replica speaks is in the catalogue's era book, gateway/bridge/eras.py)."""

    discover: dict[str, Any]
    tools: dict[str, dict[str, Any]]
    fetched_at: float
    prompts: dict[str, dict[str, Any]] = field(default_factory=dict)
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ListKind:
    """One optional list: how discovery reads it and how routes expose its items."""

    name: str  # the BackendView attribute, and the list a cursor belongs to
    method: str  # the upstream (and downstream) list method
    field: str  # the array in its result
    key: str  # the item's field that names it
    capability: str  # what discover advertises when the backend serves the list
    route_field: str  # the Route attribute naming these items
    lookup: Callable[[RouteTable, str, str], Route | None]  # the first visible route of an item


PROMPTS = ListKind(
    "prompts", "prompts/list", "prompts", "name", "prompts", "prompts", RouteTable.lookup_prompt
)
RESOURCES = ListKind(
    "resources",
    "resources/list",
    "resources",
    "uri",
    "resources",
    "resources",
    RouteTable.lookup_resource,
)
TEMPLATES = ListKind(
    "templates",
    "resources/templates/list",
    "resourceTemplates",
    "uriTemplate",
    "resources",
    "resource_templates",
    RouteTable.lookup_template,
)
LIST_KINDS = (PROMPTS, RESOURCES, TEMPLATES)
# tools/list is read with discover, not as an optional list; named for exposed() alike.
TOOLS = ListKind("tools", "tools/list", "tools", "name", "tools", "tools", RouteTable.lookup)
