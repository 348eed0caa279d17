"""What the routes do with the items backends really serve: warnings for discovery and
`taskgate check --discover`.

gateway/catalog/collisions.py judges the configuration alone; this module adds what only the
backends' lists tell, per kind, for every item some backend serves:

- shadowed: a route naming an item on a backend that serves it, which earlier routes win for
  every tenant it serves; when the winner's backend does not serve the item, those tenants see
  it nowhere.
- served by two backends: the item reaches tenants on more than one backend, each through
  a route that is not shadowed for it. That can be intended (one tenant per backend); it is
  named so that it never happens by accident.
- unreadable through a glob: a resource template a route's glob exposes (resource_templates:
  ["*"]) that the URI matcher refuses: it is listed, but resources/read reaches no URI through
  it. (`taskgate check` says so of the templates the configuration names itself.)
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from gateway.catalog.table import Route, RouteTable
from gateway.catalog.templates import TemplateError, compile_template

# (route kind, what a message calls one item)
KINDS = (
    ("tools", "tool"),
    ("prompts", "prompt"),
    ("resources", "resource"),
    ("resource_templates", "resource template"),
)


def served_warnings(table: RouteTable, served: Mapping[str, Mapping[str, Set[str]]]) -> list[str]:
    """Warnings for `served`: route kind -> backend -> the keys it lists (names, URIs or
    uriTemplates). Sorted by kind, then key, so that the same state reads the same."""
    found: list[str] = []
    for kind, label in KINDS:
        by_backend = served.get(kind, {})
        for key in sorted(set().union(*by_backend.values()) if by_backend else ()):
            found.extend(_item_warnings(table, kind, label, key, by_backend))
            if kind == "resource_templates":
                found.extend(_unreadable(table, key, by_backend))
    return found


def _unreadable(table: RouteTable, template: str, by_backend: Mapping[str, Set[str]]) -> list[str]:
    """A listed template that routes expose by a glob only and the URI matcher refuses: one
    warning per backend listing it."""
    globbed = [
        route
        for route in table.routes_matching("resource_templates", template)
        if template not in route.resource_templates
        and template in by_backend.get(route.backend, ())
    ]
    if not globbed:
        return []
    try:
        compile_template(template)
    except TemplateError as exc:
        found = []
        for backend in sorted({route.backend for route in globbed}):
            ways = ", ".join(f"routes[{r.index}]" for r in globbed if r.backend == backend)
            found.append(
                f"resource template {template!r} of backend {backend!r}: {exc}; {ways} "
                "expose it by a glob, but resources/read reaches no URI through it"
            )
        return found
    return []


def _item_warnings(
    table: RouteTable,
    kind: str,
    label: str,
    key: str,
    by_backend: Mapping[str, Set[str]],
) -> list[str]:
    routes = table.routes_matching(kind, key)
    servers = {backend for backend, keys in by_backend.items() if key in keys}
    found: list[str] = []
    live: list[Route] = []
    for route in routes:
        if route.backend not in servers:
            continue
        earlier = [e for e in routes if e.index < route.index]
        if not _covered(route, earlier):
            live.append(route)
            continue
        winner = next(e for e in earlier if _shares(e, route))
        hidden = "" if winner.backend in servers else ", whose backend does not serve it"
        found.append(
            f"{label} {key!r} of backend {route.backend!r} is shadowed: routes[{route.index}] "
            f"never reaches it, routes[{winner.index}] (backend {winner.backend!r}) matches it "
            f"first{hidden}"
        )
    if len({route.backend for route in live}) > 1:
        ways = "; ".join(
            f"routes[{route.index}] to {route.backend!r} for {_audience(route)}" for route in live
        )
        found.append(f"{label} {key!r} is served by {_backends(live)}: {ways}")
    return found


def _covered(route: Route, earlier: list[Route]) -> bool:
    """Whether `earlier` routes, together, win every tenant `route` serves."""
    if any(e.tenants is None for e in earlier):
        return True
    if route.tenants is None:
        return False
    return route.tenants <= frozenset().union(*(e.tenants or () for e in earlier))


def _shares(a: Route, b: Route) -> bool:
    """Whether some tenant sees both routes."""
    return a.tenants is None or b.tenants is None or not a.tenants.isdisjoint(b.tenants)


def _audience(route: Route) -> str:
    if route.tenants is None:
        return "every tenant"
    return f"tenants {', '.join(sorted(route.tenants))}"


def _backends(routes: list[Route]) -> str:
    names = [repr(name) for name in dict.fromkeys(route.backend for route in routes)]
    return f"backends {', '.join(names[:-1])} and {names[-1]}"
