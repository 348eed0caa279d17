"""The `routes` and `discovery` sections: what each backend serves, how that is refreshed."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, field_validator, model_validator

from gateway.config.section import Section

ROUTE_KINDS = ("tools", "prompts", "resources", "resource_templates")
"""What a route may expose, in the order `taskgate check` shows them."""

_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*:"
_URI_START = rf"(?:{_SCHEME}|\*)"  # a scheme, or a glob's `*`, which spans the scheme too
_VARCHAR = r"(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2})"
_VARSPEC = rf"{_VARCHAR}(?:\.?{_VARCHAR})*(?::[1-9][0-9]{{0,3}}|\*)?"
_EXPRESSION = rf"\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\}}"
# RFC 6570 syntax, or a glob of it (`*` outside an expression); also a JSON Schema pattern
_TEMPLATE = rf"^{_URI_START}(?:[^{{}}]|{_EXPRESSION})*$"
_URI_START_RE = re.compile(_URI_START)
_EXPRESSION_RE = re.compile(_EXPRESSION)
_TEMPLATE_RE = re.compile(_TEMPLATE)


def _name_or_glob(item: str) -> str:
    if not item.strip():
        raise ValueError("a name or glob must not be empty")
    return item


def _uri_glob(item: str) -> str:
    if not _URI_START_RE.match(item):
        raise ValueError(f"{item!r} is not a URI glob: it starts with a scheme and ':' or with '*'")
    return item


def _uri_template(item: str) -> str:
    if not _URI_START_RE.match(item):
        raise ValueError(
            f"{item!r} is not a URI template: it starts with a scheme and ':' or with '*'"
        )
    if _TEMPLATE_RE.match(item):
        return item
    rest = _EXPRESSION_RE.sub("", item)  # what is left once every good {expression} is gone
    opened, closed = rest.find("{"), rest.find("}")
    if closed != -1 and (opened == -1 or closed < opened):
        problem = "a '}' closes no '{'"
    elif opened != -1 and "}" not in rest[opened:]:
        problem = "a '{' is never closed"
    else:
        problem = "an expression is not like {name}, {+path} or {?a,b}"
    raise ValueError(f"{item!r} is not a URI template: {problem}")


_NameOrGlob = Annotated[
    str, AfterValidator(_name_or_glob), Field(json_schema_extra={"pattern": r"\S"})
]
_UriGlob = Annotated[
    str, AfterValidator(_uri_glob), Field(json_schema_extra={"pattern": f"^{_URI_START}"})
]
_UriTemplate = Annotated[
    str, AfterValidator(_uri_template), Field(json_schema_extra={"pattern": _TEMPLATE})
]


class RouteTasksConfig(Section):
    """Whether taskgate runs the route's tool calls as tasks of its own, for backends without
    the Tasks extension (docs/tasks.md, "Tasks taskgate runs")."""

    mode: Literal["off", "offer", "always"] = Field(
        "off",
        description="off: calls as they are. always: every tools/call of a client that declares "
        "the Tasks extension is answered with a task taskgate runs. offer: answered inline when "
        "the backend answers within after_ms, else with such a task. A backend that runs tasks "
        "itself, and a client without the extension, are never given one.",
    )
    after_ms: int = Field(
        1000, ge=0, le=600_000, description="offer: how long an inline answer is waited for."
    )
    ttl_s: float = Field(
        3600.0,
        gt=0,
        le=30 * 24 * 3600,
        description="The task's lifetime (ttlMs) from its creation; its call's deadline too. "
        "After it the task and its result are gone.",
    )
    poll_interval_ms: int = Field(
        1000, ge=100, le=3_600_000, description="The pollIntervalMs the task suggests."
    )
    max_result_bytes: int = Field(
        1 << 20,
        ge=1024,
        le=64 << 20,
        description="The largest final answer kept; a larger one fails the task, saying so.",
    )
    idempotent: bool = Field(
        False,
        description="The route's tools may run twice: a call whose pooled connection turns out "
        "closed is sent again. Otherwise a call is never sent twice.",
    )

    @field_validator("mode", mode="before")
    @classmethod
    def _off_unquoted(cls, value: object) -> object:
        # YAML 1.1 (PyYAML) reads an unquoted `off` as false: `mode: off` means "off".
        return "off" if value is False else value


class RouteConfig(Section):
    """What one backend serves: tools, prompts, resources and resource templates, never renamed.

    For each kind the first matching route in YAML order wins; a route names at least one item.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": [kind], "properties": {kind: {"minItems": 1}}} for kind in ROUTE_KINDS
            ]
        }
    )

    tools: tuple[_NameOrGlob, ...] = Field(
        (), description="Tool names or globs (* ? [..]) that tools/call and tools/list reach."
    )
    prompts: tuple[_NameOrGlob, ...] = Field(
        (), description="Prompt names or globs (* ? [..]): prompts/get, prompts/list, completion."
    )
    resources: tuple[_UriGlob, ...] = Field(
        (),
        description="Resource URIs or URI globs: what resources/read, resources/list and "
        "resource subscriptions reach. Only * is special and it spans '/'; '*' alone is every "
        "URI the backend lists; any other glob never matches a URI with a '.' or '..' segment.",
    )
    resource_templates: tuple[_UriTemplate, ...] = Field(
        (),
        description="uriTemplate strings (RFC 6570, e.g. reports://acme/{id}) or globs of them "
        "(a * outside {..} spans anything; '*' alone is every template the backend lists), "
        "exposed by resources/templates/list, resources/read of the URIs they produce and "
        "completion/complete's ref/resource.",
    )
    backend: str
    tenants: tuple[str, ...] | None = Field(
        None, description="Only these tenants see the route; to others its items do not exist."
    )
    scopes: tuple[str, ...] = Field(
        (), description="Scopes a token needs to use what the route exposes (else 403)."
    )
    task: RouteTasksConfig = Field(
        RouteTasksConfig(),
        description="Tool calls run as tasks taskgate holds, for backends without tasks.",
    )

    @model_validator(mode="after")
    def _names_something(self) -> RouteConfig:
        if not any(getattr(self, kind) for kind in ROUTE_KINDS):
            raise ValueError(f"a route names at least one item of {', '.join(ROUTE_KINDS)}")
        return self


class DiscoveryConfig(Section):
    """How often taskgate refreshes what it knows of its backends, and how it pages its lists."""

    refresh_s: float = Field(30.0, gt=0, le=3600)
    page_size: int = Field(
        100,
        ge=1,
        le=1000,
        description="Most items on one page of prompts/list, resources/list and "
        "resources/templates/list; longer merged lists continue with taskgate's own nextCursor.",
    )
