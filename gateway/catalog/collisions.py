"""Route items that never win, and broad routes that expose what a tenant route keeps: warnings.

Two findings, per kind (tools, prompts, resources, resource templates), in YAML order:

- shadowed: an item an earlier route of the same kind always wins for every tenant the later
  route serves. Only what is certain is reported: the same pattern twice, an exact name or URI
  an earlier glob matches, a glob an earlier `prefix*` glob covers.
- exposed: an item of a later route that some tenant outside an earlier route's `tenants` can
  see (a route without `tenants`; or a route of the same backend with other tenants) and whose
  pattern may match what the earlier route's pattern matches. This one errs on the side of
  warning: two globs that share any name count.

Which backends really serve an item is discovery's knowledge, not the configuration's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.catalog.table import name_glob, template_glob, uri_glob
from gateway.config import ROUTE_KINDS, RouteConfig

_ANY = "?"  # a token that matches any one character (also what a [..] class becomes)
_STAR = "*"  # a token that matches any run of characters


@dataclass(frozen=True, slots=True)
class _Syntax:
    compile: Callable[[str], re.Pattern[str] | None]  # None: an exact item
    wildcards: str  # characters that make a pattern a glob
    tokens: Callable[[str], list[str]]  # a pattern as literal characters, _ANY and _STAR


def _name_tokens(pattern: str) -> list[str]:
    """fnmatch's syntax, as fnmatch.translate reads it; a [..] class widens to any character."""
    tokens: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            if not tokens or tokens[-1] != _STAR:
                tokens.append(_STAR)
        elif c == "?":
            tokens.append(_ANY)
        elif c == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                tokens.append("\\[")  # an unclosed '[' is a literal
            else:
                tokens.append(_ANY)
                i = j + 1
        else:
            tokens.append("\\" + c)
    return tokens


def _uri_tokens(pattern: str) -> list[str]:
    return [_STAR if c == "*" else "\\" + c for c in pattern]


def _template_tokens(pattern: str) -> list[str]:
    """A template glob's tokens: a `*` inside `{..}` is the explode modifier, a character."""
    tokens: list[str] = []
    inside = False  # the configuration allows no nested braces
    for c in pattern:
        if c in "{}":
            inside = c == "{"
        tokens.append(_STAR if c == "*" and not inside else "\\" + c)
    return tokens


_SYNTAX = {
    "tools": _Syntax(name_glob, "*?[", _name_tokens),
    "prompts": _Syntax(name_glob, "*?[", _name_tokens),
    "resources": _Syntax(uri_glob, "*", _uri_tokens),
    "resource_templates": _Syntax(template_glob, "*", _template_tokens),
}


@dataclass(frozen=True, slots=True)
class _Item:
    path: str  # routes[2].prompts[0]
    pattern: str
    route: int
    backend: str
    tenants: frozenset[str] | None
    glob: re.Pattern[str] | None

    def covers_tenants_of(self, other: _Item) -> bool:
        """Every tenant `other`'s route serves also sees this item's route."""
        if self.tenants is None:
            return True
        return other.tenants is not None and other.tenants <= self.tenants

    def exposes_beyond(self, earlier: _Item) -> str | None:
        """To whom this item's route shows more than `earlier`'s restricted route, if anyone."""
        if earlier.tenants is None:
            return None
        if self.tenants is None:
            return "every tenant"
        others = self.tenants - earlier.tenants
        if others and self.backend == earlier.backend:
            return f"tenants {', '.join(sorted(others))}"
        return None


def collisions(routes: Sequence[RouteConfig]) -> list[str]:
    """Warnings about `routes`, in YAML order of the later item; each names both YAML paths.

    A shadowed item is reported as such and nothing else: it is never reached, so it exposes
    nothing either.
    """
    found: list[tuple[tuple[int, int, int], str]] = []
    for order, kind in enumerate(ROUTE_KINDS):
        syntax = _SYNTAX[kind]
        items = [
            _Item(
                f"routes[{r}].{kind}[{k}]",
                pattern,
                r,
                route.backend,
                frozenset(route.tenants) if route.tenants is not None else None,
                syntax.compile(pattern),
            )
            for r, route in enumerate(routes)
            for k, pattern in enumerate(getattr(route, kind))
        ]
        for n, item in enumerate(items):
            where = (item.route, order, n)
            earlier = [e for e in items[:n] if e.route < item.route]
            shadow = next((e for e in earlier if _shadows(e, item, syntax)), None)
            if shadow is not None:
                found.append(
                    (
                        where,
                        f"{item.path} {item.pattern!r} is shadowed: "
                        f"{shadow.path} {shadow.pattern!r} matches it first",
                    )
                )
                continue
            for kept in earlier:
                audience = item.exposes_beyond(kept)
                if audience is None or not _overlap(kept, item, syntax):
                    continue
                keeps = (
                    f"tenants {', '.join(sorted(kept.tenants))}" if kept.tenants else "no tenant"
                )
                through = (
                    ""
                    if item.backend == kept.backend
                    else f" (through backend {item.backend!r}, not {kept.backend!r})"
                )
                found.append(
                    (
                        where,
                        f"{item.path} {item.pattern!r} would expose to {audience} what "
                        f"{kept.path} {kept.pattern!r} keeps to {keeps}{through}",
                    )
                )
    found.sort(key=lambda finding: finding[0])  # stable: an item's findings keep their order
    return [message for _, message in found]


def _shadows(earlier: _Item, later: _Item, syntax: _Syntax) -> bool:
    """Certain, never guessed: `earlier` wins every key `later` matches, for its every tenant."""
    if not earlier.covers_tenants_of(later):
        return False
    if earlier.pattern == later.pattern:
        return True
    if earlier.glob is None:
        return False
    if later.glob is None:
        return earlier.glob.fullmatch(later.pattern) is not None
    # A later glob inside an earlier `prefix*`: everything it matches starts with the prefix.
    prefix = earlier.pattern[:-1]
    return (
        earlier.pattern.endswith("*")
        and not any(c in syntax.wildcards for c in prefix)
        and later.pattern.startswith(prefix)
    )


def _overlap(a: _Item, b: _Item, syntax: _Syntax) -> bool:
    """Whether some key may match both patterns (classes count as any character)."""
    if a.pattern == b.pattern:
        return True
    if a.glob is None and b.glob is None:
        return False
    if b.glob is None:
        return a.glob is not None and a.glob.fullmatch(b.pattern) is not None
    if a.glob is None:
        return b.glob.fullmatch(a.pattern) is not None
    return _tokens_meet(syntax.tokens(a.pattern), syntax.tokens(b.pattern))


def _tokens_meet(a: list[str], b: list[str]) -> bool:
    """Whether two token patterns share a string: a search over pairs of positions."""
    seen: set[tuple[int, int]] = set()
    todo = [(0, 0)]
    while todo:
        i, j = todo.pop()
        if (i, j) in seen:
            continue
        seen.add((i, j))
        if i == len(a) and j == len(b):
            return True
        if i < len(a) and a[i] == _STAR:
            todo.append((i + 1, j))  # a's star matches nothing more
        if j < len(b) and b[j] == _STAR:
            todo.append((i, j + 1))
        if i < len(a) and j < len(b):
            x, y = a[i], b[j]
            if x in (_STAR, _ANY) or y in (_STAR, _ANY) or x == y:
                # one character both sides accept; a star may go on matching
                todo.append((i if x == _STAR else i + 1, j if y == _STAR else j + 1))
    return False
