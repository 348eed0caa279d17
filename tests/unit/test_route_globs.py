"""`*` and globs for resources and resource templates: what the table, the collision checks and
discovery's warnings make of them (issue 24, item 2)."""

from __future__ import annotations

import pytest

from gateway.catalog.collisions import collisions
from gateway.catalog.served import served_warnings
from gateway.catalog.table import RouteTable, template_glob
from gateway.config import RouteConfig

FILES = "reports://{tenant}/files/{path*}"
REPORT = "reports://{tenant}/reports/{id}"
SEARCH = "reports://{tenant}/search{?q,limit}"


def route(
    backend: str = "b",
    tenants: tuple[str, ...] | None = None,
    *,
    resources: tuple[str, ...] = (),
    resource_templates: tuple[str, ...] = (),
) -> RouteConfig:
    return RouteConfig(
        backend=backend,
        tenants=tenants,
        resources=resources,
        resource_templates=resource_templates,
    )


# --- resources: `*` is every URI -----------------------------------------------------------


@pytest.mark.parametrize(
    "uri",
    [
        "reports://about",
        "file:///srv/../etc/motd",  # `*` keeps no prefix a dot segment could leave
        "urn:isbn:0451450523",
        "",
    ],
)
def test_a_star_resource_route_matches_every_uri(uri: str) -> None:
    routes = RouteTable((route(resources=("*",)),))

    assert routes.lookup_resource(uri, "acme") is not None


def test_a_glob_that_starts_with_a_star_keeps_the_dot_segment_rule() -> None:
    routes = RouteTable((route(resources=("*.csv",)),))

    assert routes.lookup_resource("file:///a/b.csv", "acme") is not None
    assert routes.lookup_resource("file:///a/../b.csv", "acme") is None
    assert routes.lookup_resource("file:///a/b.csv.gz", "acme") is None


def test_a_star_route_hidden_from_the_tenant_falls_through_to_the_next() -> None:
    routes = RouteTable(
        (route("acme-only", ("acme",), resources=("*",)), route("shared", resources=("r://*",)))
    )

    assert routes.lookup_resource("r://x", "acme").backend == "acme-only"  # type: ignore[union-attr]
    assert routes.lookup_resource("r://x", "globex").backend == "shared"  # type: ignore[union-attr]
    assert routes.lookup_resource("s://x", "globex") is None


# --- templates: matched as strings, exact or by glob --------------------------------------


@pytest.mark.parametrize(
    ("pattern", "exact"),
    [
        ("reports://{id}", True),
        (FILES, True),  # {path*}: the explode modifier, not a glob
        (SEARCH, True),
        ("reports://{tenant}/*", False),
        ("file:///{path}*", False),
        ("*", False),
    ],
)
def test_a_template_entry_is_a_glob_only_with_a_star_outside_its_expressions(
    pattern: str, exact: bool
) -> None:
    assert (template_glob(pattern) is None) is exact


def test_a_template_glob_reaches_the_listed_templates_it_matches() -> None:
    routes = RouteTable((route("reports", resource_templates=("reports://{tenant}/*",)),))
    listed = {"reports": [REPORT, FILES, SEARCH, "other://{x}"]}

    found = routes.templates_matching("reports://acme/reports/42", "acme", listed)
    assert [(r.backend, t) for r, t in found] == [("reports", REPORT)]
    found = routes.templates_matching("reports://acme/files/q1/sales.csv", "acme", listed)
    assert [t for _, t in found] == [FILES]
    assert routes.templates_matching("other://1", "acme", listed) == []
    # without the backend's list, a glob reaches nothing: it names no template itself
    assert routes.templates_matching("reports://acme/reports/42", "acme") == []
    assert routes.templates_matching("reports://acme/reports/42", "acme", {"x": [REPORT]}) == []


def test_a_star_template_route_reaches_every_listed_template_of_its_own_backend() -> None:
    routes = RouteTable((route("a", resource_templates=("*",)),))
    listed = {"a": [REPORT], "b": ["b://{id}"]}

    assert [t for _, t in routes.templates_matching("reports://x/reports/1", "t", listed)] == [
        REPORT
    ]
    assert routes.templates_matching("b://1", "t", listed) == []
    assert routes.lookup_template(REPORT, "t") is not None  # the list and completion see it
    assert routes.lookup_template("anything://{at}/all", "t") is not None


def test_a_template_an_earlier_route_claims_is_not_read_through_a_later_glob() -> None:
    """The rule of resources/templates/list (first visible route wins) holds for reads: a
    template the list does not show through a route is not read through it either."""
    routes = RouteTable(
        (
            route("a", resource_templates=(REPORT,)),
            route("b", resource_templates=("*",)),
            route("c", ("globex",), resource_templates=("*",)),
        )
    )
    listed = {"a": [], "b": [REPORT, FILES], "c": [REPORT]}

    found = routes.templates_matching("reports://x/reports/1", "acme", listed)
    assert [(r.backend, t) for r, t in found] == [("a", REPORT)]  # b's is a's, which lacks it
    found = routes.templates_matching("reports://x/files/y", "acme", listed)
    assert [(r.backend, t) for r, t in found] == [("b", FILES)]


def test_a_listed_template_the_matcher_refuses_reaches_no_uri() -> None:
    routes = RouteTable((route("b", resource_templates=("*",)),), memo_size=2)
    listed = {"b": ["x://{a}{b}", *(f"n{i}://{{id}}" for i in range(10))]}

    assert routes.templates_matching("x://ab", "t", listed) == []
    assert [t for _, t in routes.templates_matching("n7://1", "t", listed)] == ["n7://{id}"]
    assert len(routes._listed_patterns) <= 2  # the compiled templates stay bounded


def test_an_exact_and_a_glob_entry_of_one_route_name_a_template_once() -> None:
    routes = RouteTable((route("b", resource_templates=(REPORT, "reports://*")),))

    found = routes.templates_matching("reports://x/reports/1", "t", {"b": [REPORT]})
    assert [t for _, t in found] == [REPORT]


# --- collisions: the configuration alone ---------------------------------------------------


def test_everything_after_a_star_route_is_shadowed() -> None:
    found = collisions(
        (
            route("a", resources=("*",), resource_templates=("*",)),
            route("b", resources=("r://x/*", "r://x/../y"), resource_templates=(REPORT,)),
        )
    )

    assert found == [
        "routes[1].resources[0] 'r://x/*' is shadowed: routes[0].resources[0] '*' matches it first",
        "routes[1].resources[1] 'r://x/../y' is shadowed: routes[0].resources[0] '*' matches "
        "it first",
        f"routes[1].resource_templates[0] {REPORT!r} is shadowed: "
        "routes[0].resource_templates[0] '*' matches it first",
    ]


def test_a_template_glob_shadows_and_exposes_like_a_uri_glob() -> None:
    found = collisions(
        (
            route("b", ("acme",), resource_templates=("reports://{tenant}/*",)),
            route("b", ("acme",), resource_templates=(FILES,)),
            route("b", resource_templates=("reports://*",)),
            route("b", resource_templates=("other://{path*}",)),  # the * is no glob: no overlap
        )
    )

    assert found == [
        f"routes[1].resource_templates[0] {FILES!r} is shadowed: "
        "routes[0].resource_templates[0] 'reports://{tenant}/*' matches it first",
        "routes[2].resource_templates[0] 'reports://*' would expose to every tenant what "
        "routes[0].resource_templates[0] 'reports://{tenant}/*' keeps to tenants acme",
        "routes[2].resource_templates[0] 'reports://*' would expose to every tenant what "
        f"routes[1].resource_templates[0] {FILES!r} keeps to tenants acme",
    ]


def test_an_explode_modifier_is_no_wildcard_to_the_collision_checks() -> None:
    assert (
        collisions(
            (
                route("b", ("acme",), resource_templates=("r://{path*}",)),
                route("b", resource_templates=("r://{pathx}",)),
            )
        )
        == []
    )


# --- discovery's warnings: what the backends list ------------------------------------------


def test_star_routes_on_two_backends_leave_the_second_backends_items_nowhere() -> None:
    routes = RouteTable(
        (
            route("a", resources=("*",), resource_templates=("*",)),
            route("b", resources=("*",), resource_templates=("*",)),
        )
    )
    served = {
        "resources": {"a": {"a://1"}, "b": {"b://1"}},
        "resource_templates": {"a": {"a://{x}"}, "b": {"b://{x}"}},
    }

    assert served_warnings(routes, served) == [
        "resource 'b://1' of backend 'b' is shadowed: routes[1] never reaches it, routes[0] "
        "(backend 'a') matches it first, whose backend does not serve it",
        "resource template 'b://{x}' of backend 'b' is shadowed: routes[1] never reaches it, "
        "routes[0] (backend 'a') matches it first, whose backend does not serve it",
    ]


def test_a_template_exposed_by_a_glob_that_no_uri_is_read_through_is_named() -> None:
    routes = RouteTable(
        (route("a", resource_templates=("*",)), route("b", resource_templates=("x://{a}{b}",)))
    )
    served = {"resource_templates": {"a": {"x://{a}{b}", "a://{id}"}, "b": {"x://{a}{b}"}}}

    found = served_warnings(routes, served)

    assert [w for w in found if "resources/read" in w] == [
        "resource template 'x://{a}{b}' of backend 'a': two variables share a path segment in "
        "'x://{a}{b}'; routes[0] expose it by a glob, but resources/read reaches no URI "
        "through it"
    ]
