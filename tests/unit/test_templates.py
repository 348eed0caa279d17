"""The URI template matcher: which URIs a template could produce, anchored, never slow."""

from __future__ import annotations

import time

import pytest

from gateway.catalog.table import RouteTable
from gateway.catalog.templates import TemplateError, compile_template, matches
from gateway.config import RouteConfig

REPORT = "reports://{tenant}/reports/{id}"
FILES = "reports://{tenant}/files/{path*}"
SEARCH = "reports://{tenant}/search{?q,limit}"


@pytest.mark.parametrize(
    ("template", "uri"),
    [
        (REPORT, "reports://acme/reports/42"),
        (REPORT, "reports://globex/reports/a%20b"),
        (REPORT, "reports://acme/reports/r1-2"),
        (FILES, "reports://acme/files/q1/sales.csv"),
        (FILES, "reports://acme/files/x"),
        (FILES, "reports://acme/files/a/b/c/d.txt"),
        (SEARCH, "reports://acme/search"),
        (SEARCH, "reports://acme/search?q=late"),
        (SEARCH, "reports://acme/search?q=late&limit=3"),
        (SEARCH, "reports://acme/search?limit=3&q=late"),  # any order
        (SEARCH, "reports://acme/search?q="),  # an empty value
        ("file:///{+path}", "file:///etc/app/config.json"),
        ("api://items{/id}", "api://items"),
        ("api://items{/id}", "api://items/7"),
        ("x://{name}.json", "x://a.b.json"),  # the variable gives back what the literal needs
        ("x://{a*}/{b}/end", "x://p/q/r/end"),
        ("api://tree{/parts*}", "api://tree/a/b/c"),
        ("api://tree{/parts*}", "api://tree"),
        ("api://list?x=1{&page,size}", "api://list?x=1&page=2"),
        ("plain://no/variables", "plain://no/variables"),
    ],
)
def test_a_uri_the_template_could_produce_matches(template: str, uri: str) -> None:
    assert matches(template, uri)


@pytest.mark.parametrize(
    ("template", "uri"),
    [
        (REPORT, "reports://acme/reports"),  # the parameter missing
        (REPORT, "reports://acme/reports/"),  # empty
        (REPORT, "reports://acme/reports/4/2"),  # {id} is one segment
        (REPORT, "reports://acme/reports/42?x=1"),  # no query in this template
        (REPORT, "reports://acme/reports/42#frag"),  # never a fragment
        (REPORT, "reports://acme/reports/42/"),  # anchored at the end
        (REPORT, "xreports://acme/reports/42"),  # anchored at the start
        (REPORT, "reports://a/b/reports/42"),  # {tenant} is one segment
        (REPORT, "reports://acme/Reports/42"),  # literals are case-sensitive
        (REPORT, "reports://../reports/42"),  # a dot segment
        (FILES, "reports://acme/files/"),  # empty
        (FILES, "reports://acme/files/../summary"),  # traversal
        (FILES, "reports://acme/files/a/./b"),
        (FILES, "reports://acme/files/%2e%2E/summary"),  # encoded traversal
        (FILES, "reports://acme/files/a?b"),  # no query
        (SEARCH, "reports://acme/search?"),  # an empty query is not one it produces
        (SEARCH, "reports://acme/search?other=1"),  # a name the template does not have
        (SEARCH, "reports://acme/search?q=a&other=1"),
        (SEARCH, "reports://acme/search?q"),  # no '='
        (SEARCH, "reports://acme/searching"),
        ("api://items{/id}", "api://items/7/8"),
        ("plain://no/variables", "plain://no/variables/"),
    ],
)
def test_anything_else_does_not(template: str, uri: str) -> None:
    assert not matches(template, uri)


def test_literal_regex_characters_are_literal() -> None:
    template = "odd://a.b+c(d)[e]|{x}"
    assert matches(template, "odd://a.b+c(d)[e]|1")
    assert not matches(template, "odd://aXb+c(d)[e]|1")


def test_a_compiled_pattern_is_accepted_too() -> None:
    pattern = compile_template(REPORT)
    assert matches(pattern, "reports://acme/reports/42")
    assert not matches(pattern, "reports://acme/reports")


@pytest.mark.parametrize(
    "template",
    [
        "x://{#frag}",  # fragment expansion
        "x://{.ext}",  # label expansion
        "x://{;params}",  # path-style parameters
        "x://{a,b}",  # several variables in a simple expression
        "x://{+a,b}",
        "x://{unclosed",
        "x://closed}",
        "x://{}",
        "x://{a:3}",  # prefix modifiers
        "x://{a}{b}",  # two variables competing for one segment
        "x://{a}-{b}",
        "x://{a*}/{b*}",  # two multi-segment variables
        "x://{+a}/x/{b*}",
        "x://{/a}{b}",
    ],
)
def test_what_is_not_supported_is_refused_at_compile_time(template: str) -> None:
    with pytest.raises(TemplateError):
        compile_template(template)


@pytest.mark.parametrize(
    ("template", "uri"),
    [
        ("x://{a*}/{b}/{c}/end", "x://" + "a/" * 4000 + "!"),
        (FILES, "reports://acme/files/" + "a/" * 4000 + "?"),
        (SEARCH, "reports://acme/search?" + "q=&" * 3000 + "#"),
        ("x://{a}.json", "x://" + "a." * 4000 + "jso"),
        ("x://{a}/{b}/{c}", "x://" + "a" * 8000 + "/"),
        ("api://tree{/parts*}/end", "api://tree" + "/a" * 4000 + "/"),
    ],
)
def test_a_hostile_uri_is_refused_quickly(template: str, uri: str) -> None:
    started = time.perf_counter()
    assert not matches(template, uri)
    assert time.perf_counter() - started < 1.0


def test_the_route_table_names_every_visible_matching_template_in_yaml_order() -> None:
    routes = RouteTable(
        (
            RouteConfig(tools=(), backend="acme", tenants=("acme",), resource_templates=(SEARCH,)),
            RouteConfig(tools=(), backend="shared", resource_templates=(REPORT, FILES)),
            RouteConfig(
                tools=(), backend="late", resource_templates=("reports://{t}/{kind}/{id}",)
            ),
            RouteConfig(tools=(), backend="odd", resource_templates=("x://{a}{b}",)),  # refused
        )
    )
    found = routes.templates_matching("reports://acme/reports/42", "globex")
    assert [(r.backend, t) for r, t in found] == [
        ("shared", REPORT),
        ("late", "reports://{t}/{kind}/{id}"),
    ]
    assert routes.templates_matching("reports://acme/search?q=1", "globex") == []
    assert [r.backend for r, _ in routes.templates_matching("reports://acme/search", "acme")] == [
        "acme"
    ]
    assert (
        routes.templates_matching("x://ab", "acme") == []
    )  # an unsupported template reaches nothing
    assert routes.lookup_template("x://{a}{b}", "acme") is not None  # completion still finds it
    assert routes.templates_matching("reports://acme/reports/" + "4" * 9000, "acme") == []
