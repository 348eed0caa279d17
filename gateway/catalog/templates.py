"""Matching a resource URI against an RFC 6570 URI template: is this URI one the template
could have produced? Pure; used to route `resources/read` of a template-expanded URI.

Supported expressions (what MCP servers use in practice):

- `{var}`: one path segment, non-empty, without `/`, `?` or `#`.
- `{var*}` and `{+var}`: one or more characters spanning segments (`/` included), without
  `?` or `#`: a path such as `q1/sales.csv`.
- `{/var}`: an optional `/segment`; `{/var*}`: zero or more `/segment`s.
- `{?a,b}`: an optional query `?name=value&...` whose names are among `a, b` (any order,
  each value without `&` or `#`, possibly empty); `{&a,b}` continues a query the same way.

Two limits keep every match linear in the URI length (the patterns have no nested
quantifiers, and no two variables compete for the same characters): at most one
multi-segment variable (`{var*}`, `{+var}`, `{/var*}`) per template, and no two path variables
in one segment (`{a}-{b}`, `{a}{b}`; a `/` between them is fine). A template outside these
rules is TemplateError, as is any other operator (`{#..}`, `{.x}`, `{;x}`), a prefix modifier
(`{x:3}`) or several variables in one path expression (`{a,b}`).

Literal text matches itself exactly (the URI is compared as sent: nothing is decoded). The
match is anchored at both ends, a URI with a fragment never matches, and neither does one with
a `.` or `..` path segment (plain or percent-encoded): a backend that resolves it would leave
the prefix a template keeps to a tenant.
"""

from __future__ import annotations

import re

# `{` operator? varname (`*`)? (`,` varname (`*`)?)* `}`
_EXPRESSION = re.compile(r"\{([+#./;?&]?)([A-Za-z0-9_%.]+\*?(?:,[A-Za-z0-9_%.]+\*?)*)\}")
_SEGMENT = r"[^/?#]"
_SPAN = r"[^?#]"
_DOT_SEGMENT = r"(?:^|[/\\:])(?:\.|%2[eE]){1,2}(?:[/\\?#]|\Z)"


class TemplateError(ValueError):
    """A URI template with an expression this matcher does not support."""


def _names(spec: str) -> list[tuple[str, bool]]:
    return [(name.rstrip("*"), name.endswith("*")) for name in spec.split(",")]


def _query(names: list[tuple[str, bool]], lead: str) -> str:
    keys = "|".join(re.escape(name) for name, _ in sorted(names, key=lambda n: -len(n[0])))
    pair = rf"(?:{keys})=[^&#]*"
    if lead == "?":
        return rf"(?:\?{pair}(?:&{pair})*)?"
    return rf"(?:&{pair})*"


def _expression(operator: str, spec: str, template: str) -> str:
    names = _names(spec)
    if operator in ("?", "&"):
        return _query(names, operator)
    if len(names) != 1:
        raise TemplateError(f"unsupported expression in {template!r}: several variables")
    _, explode = names[0]
    if operator == "" and not explode:
        return f"{_SEGMENT}+"
    if (operator == "" and explode) or (operator == "+" and not explode):
        return f"{_SPAN}+"
    if operator == "/":
        return f"(?:/{_SEGMENT}*)*" if explode else f"(?:/{_SEGMENT}*)?"
    raise TemplateError(f"unsupported expression in {template!r}: {{{operator}{spec}}}")


def compile_template(template: str) -> re.Pattern[str]:
    """The anchored pattern of `template`; TemplateError for an unsupported expression, or
    for a template whose variables could compete for the same characters (see the module)."""
    parts: list[str] = []
    last = 0
    spanning = 0
    in_segment = False  # a path variable already takes part of the current segment
    for found in _EXPRESSION.finditer(template):
        literal = template[last : found.start()]
        if "{" in literal or "}" in literal:
            raise TemplateError(f"malformed expression in {template!r}")
        if "/" in literal:
            in_segment = False
        operator, spec = found.group(1), found.group(2)
        if operator in ("", "+"):
            if in_segment:
                raise TemplateError(f"two variables share a path segment in {template!r}")
            in_segment = True
        elif operator == "/":
            in_segment = True
        spanning += operator == "+" or (operator in ("", "/") and spec.endswith("*"))
        if spanning > 1:
            raise TemplateError(f"more than one multi-segment variable in {template!r}")
        parts.append(re.escape(literal))
        parts.append(_expression(operator, spec, template))
        last = found.end()
    tail = template[last:]
    if "{" in tail or "}" in tail:
        raise TemplateError(f"malformed expression in {template!r}")
    parts.append(re.escape(tail))
    return re.compile(rf"(?s)(?!.*{_DOT_SEGMENT})(?!.*#){''.join(parts)}")


def matches(template: str | re.Pattern[str], uri: str) -> bool:
    """Whether `uri` is one `template` could produce (see the module for what is supported)."""
    pattern = compile_template(template) if isinstance(template, str) else template
    return pattern.fullmatch(uri) is not None
