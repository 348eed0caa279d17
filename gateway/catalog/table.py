"""The compiled route table: (item, tenant) -> route per kind; the first visible match wins.

Tools and prompts are names: exact, or fnmatch globs (`*`, `?`, `[..]`), case-sensitive.
Resources are URIs: exact, or globs in which only `*` is special; it matches any run of
characters, `/` included, so `reports://acme/*` reaches `reports://acme/2024/q1` (URIs nest
where names do not, and `?` and `[` are ordinary URI characters: a query, an IPv6 host). A glob
never matches a URI with a `.` or `..` path segment (`%2e` too): a backend that resolves it
would leave the prefix the route keeps to a tenant. `*` alone is every URI, dot segments too:
it keeps no prefix to leave.

Resource templates are the uriTemplate strings a backend lists, matched as strings: exact, or
globs with the rules of URI globs, where a `*` outside `{..}` spans anything and a `*` inside
an expression is RFC 6570's explode modifier, itself (`file:///{path*}` is exact;
`file:///{path}*` a glob; `*` every template). A URI is read through a template route by the
templates that could produce it: an exact entry's own, compiled once; a glob's, among those its
backend lists (which the catalogue passes in), compiled when first seen.

A route whose `tenants` leaves the caller out is skipped, not final: a later route visible to
the caller may still match, for every kind alike.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from gateway.catalog.templates import TemplateError, compile_template
from gateway.config import RouteConfig, RouteTasksConfig

log = logging.getLogger("taskgate.routing")

_GLOB_CHARS = frozenset("*?[")
_TEMPLATE_URI_MAX = 8192  # longer URIs match no template: a bound on the matching cost
_MEMO_KEY_MAX = 2048  # longer names and URIs are matched every time rather than remembered

# A `.` or `..` segment (plain or percent-encoded) between separators, or at either end.
_DOT_SEGMENT = r"(?:^|[/\\:])(?:\.|%2[eE]){1,2}(?:[/\\?#]|\Z)"
_EVERYTHING = re.compile(r"(?s).*")  # the glob `*` alone
_EXPRESSION = re.compile(r"\{[^{}]*\}")  # a template's {..}, as the configuration checked it


@dataclass(frozen=True, slots=True)
class Route:
    index: int  # position in the YAML, which is also its precedence
    backend: str
    tools: tuple[str, ...]
    tenants: frozenset[str] | None = None  # None: every tenant sees the route
    scopes: tuple[str, ...] = ()  # what a token needs to use it
    prompts: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    resource_templates: tuple[str, ...] = ()
    # Its tool calls as tasks taskgate runs (gateway/tasks/made.py); None: mode off.
    task: RouteTasksConfig | None = None

    def visible_to(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants


def name_glob(pattern: str) -> re.Pattern[str] | None:
    """A tool or prompt glob compiled (fnmatch, case-sensitive), or None for an exact name."""
    if _GLOB_CHARS.isdisjoint(pattern):
        return None
    return re.compile(fnmatch.translate(pattern))


def uri_glob(pattern: str) -> re.Pattern[str] | None:
    """A resource glob compiled (`*` spans anything, `/` included), or None for an exact URI."""
    if "*" not in pattern:
        return None
    return _star_glob(pattern.replace("[", "[[]").replace("?", "[?]"))


def template_glob(pattern: str) -> re.Pattern[str] | None:
    """A resource template glob compiled (a `*` outside `{..}` spans anything), or None for an
    exact uriTemplate (a `*` inside an expression is the explode modifier, matched as itself)."""
    pieces: list[str] = []
    wild = False
    last = 0
    for found in _EXPRESSION.finditer(pattern):
        outside = pattern[last : found.start()]
        wild = wild or "*" in outside
        pieces.append(outside.replace("[", "[[]").replace("?", "[?]"))
        pieces.append(found.group().replace("[", "[[]").replace("?", "[?]").replace("*", "[*]"))
        last = found.end()
    tail = pattern[last:]
    if not wild and "*" not in tail:
        return None
    pieces.append(tail.replace("[", "[[]").replace("?", "[?]"))
    return _star_glob("".join(pieces))


def _star_glob(escaped: str) -> re.Pattern[str]:
    """fnmatch's translation of a glob whose `[` and `?` are escaped already (its atomic groups:
    no catastrophic backtracking), behind a look-ahead that refuses dot segments; `*` alone is
    everything."""
    if escaped == "*":
        return _EVERYTHING
    return re.compile(rf"(?s)(?!.*{_DOT_SEGMENT}){fnmatch.translate(escaped)}")


class _Index:
    """One kind's patterns: exact strings in a dict, globs compiled once, the routes matching a
    key memoised in a bounded LRU."""

    __slots__ = ("_exact", "_globs", "_memo_size", "memo")

    def __init__(
        self,
        entries: Iterable[tuple[str, Route]],
        compile_glob: Callable[[str], re.Pattern[str] | None],
        memo_size: int,
    ) -> None:
        self._exact: dict[str, list[Route]] = {}
        self._globs: list[tuple[re.Pattern[str], Route]] = []
        for pattern, route in entries:
            glob = compile_glob(pattern)
            if glob is None:
                self._exact.setdefault(pattern, []).append(route)
            else:
                self._globs.append((glob, route))
        self.memo: OrderedDict[str, tuple[Route, ...]] = OrderedDict()
        self._memo_size = memo_size

    def matching(self, key: str, *, remember: bool = True) -> tuple[Route, ...]:
        """Every route with a pattern matching `key`, in YAML order; `remember=False` for a
        scan of many keys, which must not evict what the hot path looks up."""
        found = self.memo.get(key)
        if found is not None:
            self.memo.move_to_end(key)
            return found
        routes = {route.index: route for route in self._exact.get(key, ())}
        for pattern, route in self._globs:
            if pattern.fullmatch(key):
                routes.setdefault(route.index, route)
        found = tuple(routes[i] for i in sorted(routes))
        if remember and len(key) <= _MEMO_KEY_MAX:
            self.memo[key] = found
            if len(self.memo) > self._memo_size:
                self.memo.popitem(last=False)
        return found


def _first_visible(routes: tuple[Route, ...], tenant: str) -> Route | None:
    for route in routes:
        if route.visible_to(tenant):
            return route
    return None


class RouteTable:
    """Per kind, exact items in a dict and globs compiled once; the routes matching a name or
    URI are memoised in a bounded LRU, so a lookup is a dict hit plus a scan of the (few) routes
    naming that item."""

    def __init__(self, routes: tuple[RouteConfig, ...], *, memo_size: int = 4096) -> None:
        self.routes = tuple(
            Route(
                index=i,
                backend=r.backend,
                tools=r.tools,
                tenants=frozenset(r.tenants) if r.tenants is not None else None,
                scopes=r.scopes,
                prompts=r.prompts,
                resources=r.resources,
                resource_templates=r.resource_templates,
                task=r.task if r.task.mode != "off" else None,
            )
            for i, r in enumerate(routes)
        )
        self._tools = _Index(
            ((tool, route) for route in self.routes for tool in route.tools), name_glob, memo_size
        )
        self._prompts = _Index(
            ((name, route) for route in self.routes for name in route.prompts),
            name_glob,
            memo_size,
        )
        self._resources = _Index(
            ((uri, route) for route in self.routes for uri in route.resources),
            uri_glob,
            memo_size,
        )
        self._templates = _Index(
            ((template, route) for route in self.routes for template in route.resource_templates),
            template_glob,
            memo_size,
        )
        # For resources/read of a template-expanded URI: each route's entries in YAML order, an
        # exact uriTemplate compiled once (one the matcher does not support reaches no URI;
        # completion, which names the template string, still finds it), a glob as its pattern.
        self._template_reads: list[tuple[Route, str, re.Pattern[str] | None, bool]] = []
        for route in self.routes:
            for template in dict.fromkeys(route.resource_templates):
                glob = template_glob(template)
                if glob is not None:
                    self._template_reads.append((route, template, glob, True))
                    continue
                try:
                    compiled = compile_template(template)
                except TemplateError as exc:
                    log.warning("route %d: %s; no URI is read through it", route.index, exc)
                    continue
                self._template_reads.append((route, template, compiled, False))
        # The templates backends list, compiled as a glob first reaches them (None: refused).
        self._listed_patterns: OrderedDict[str, re.Pattern[str] | None] = OrderedDict()
        self._memo_size = memo_size

    def lookup(self, tool: str, tenant: str) -> Route | None:
        """The route serving `tool` to `tenant`, or None when no route exposes it to them."""
        for route in self._tools.matching(tool):  # the hot path: no helper call in between
            if route.visible_to(tenant):
                return route
        return None

    def lookup_prompt(self, name: str, tenant: str) -> Route | None:
        """The route serving prompt `name` to `tenant`, or None when no route exposes it."""
        return _first_visible(self._prompts.matching(name), tenant)

    def lookup_resource(self, uri: str, tenant: str) -> Route | None:
        """The route serving resource `uri` to `tenant` (exact or `*` glob, see the module)."""
        return _first_visible(self._resources.matching(uri), tenant)

    def lookup_template(self, uri_template: str, tenant: str) -> Route | None:
        """The route exposing this `uriTemplate` string to `tenant` (exact or glob), or None."""
        return _first_visible(self._templates.matching(uri_template), tenant)

    def template_glob_backends(self, tenant: str) -> list[str]:
        """Backends of the routes visible to `tenant` with a template glob: whose listed
        templates templates_matching needs."""
        found = (
            r.backend for r, _, _, glob in self._template_reads if glob and r.visible_to(tenant)
        )
        return list(dict.fromkeys(found))

    def templates_matching(
        self, uri: str, tenant: str, listed: Mapping[str, Collection[str]] | None = None
    ) -> list[tuple[Route, str]]:
        """Every (route, uriTemplate) visible to `tenant` whose template could produce `uri`,
        in YAML order (gateway/catalog/templates.py says which expressions are understood).
        A glob entry yields the templates `listed[backend]` names that it matches and that no
        earlier visible route claims (the rule of resources/templates/list), in their order."""
        if len(uri) > _TEMPLATE_URI_MAX:
            return []
        found: list[tuple[Route, str]] = []
        for route, template, pattern, glob in self._template_reads:
            if not route.visible_to(tenant):
                continue
            if not glob:
                if pattern is not None and pattern.fullmatch(uri):
                    found.append((route, template))
                continue
            for candidate in listed.get(route.backend, ()) if listed is not None else ():
                if (
                    pattern is not None
                    and pattern.fullmatch(candidate)
                    and self.lookup_template(candidate, tenant) is route
                    and (route, candidate) not in found
                ):
                    compiled = self._listed_pattern(candidate)
                    if compiled is not None and compiled.fullmatch(uri):
                        found.append((route, candidate))
        return found

    def _listed_pattern(self, template: str) -> re.Pattern[str] | None:
        """A listed template compiled, remembered in a bounded LRU; None when refused (served.py
        warns of it)."""
        if template in self._listed_patterns:
            self._listed_patterns.move_to_end(template)
            return self._listed_patterns[template]
        try:
            compiled: re.Pattern[str] | None = compile_template(template)
        except TemplateError:
            compiled = None
        self._listed_patterns[template] = compiled
        if len(self._listed_patterns) > self._memo_size:
            self._listed_patterns.popitem(last=False)
        return compiled

    def routes_matching(self, kind: str, key: str) -> tuple[Route, ...]:
        """Every route of `kind` (a ROUTE_KINDS name) naming `key`, for any tenant, in YAML
        order: what discovery's warnings weigh (gateway/catalog/served.py)."""
        index = {
            "tools": self._tools,
            "prompts": self._prompts,
            "resources": self._resources,
            "resource_templates": self._templates,
        }
        return index[kind].matching(key, remember=False)

    def backends(self) -> list[str]:
        """Backends some route points to, in order of first appearance."""
        return list(dict.fromkeys(route.backend for route in self.routes))
