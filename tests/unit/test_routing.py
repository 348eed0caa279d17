"""Tool name -> backend: exact names and globs, the first matching route in YAML order wins."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.catalog.table import Route, RouteTable
from gateway.config import RouteConfig


def table(*routes: tuple[list[str], str], memo_size: int = 4096) -> RouteTable:
    return RouteTable(
        tuple(RouteConfig(tools=tuple(tools), backend=backend) for tools, backend in routes),
        memo_size=memo_size,
    )


def tenant_table() -> RouteTable:
    return RouteTable(
        (
            RouteConfig(tools=("report_*",), backend="acme-reports", tenants=("acme",)),
            RouteConfig(tools=("report_*",), backend="shared", scopes=("reports",)),
            RouteConfig(tools=("secret",), backend="vault", tenants=("globex",)),
        )
    )


def test_a_route_restricted_to_other_tenants_is_invisible() -> None:
    routes = tenant_table()
    assert routes.lookup("secret", "acme") is None
    found = routes.lookup("secret", "globex")
    assert found is not None
    assert found.backend == "vault"


def test_each_tenant_gets_the_first_route_visible_to_it() -> None:
    routes = tenant_table()
    acme, globex = routes.lookup("report_x", "acme"), routes.lookup("report_x", "globex")
    assert acme is not None
    assert globex is not None
    assert (acme.backend, globex.backend) == ("acme-reports", "shared")
    assert globex.scopes == ("reports",)


def backend_of(routes: RouteTable, tool: str) -> str | None:
    route = routes.lookup(tool, "acme")
    return None if route is None else route.backend


def test_an_exact_name_routes_to_its_backend() -> None:
    routes = table((["echo", "whoami"], "a"), (["search"], "b"))

    assert backend_of(routes, "echo") == "a"
    assert backend_of(routes, "whoami") == "a"
    assert backend_of(routes, "search") == "b"


@pytest.mark.parametrize(
    ("pattern", "tool", "matches"),
    [
        ("report_*", "report_x", True),
        ("report_*", "report_", True),
        ("report_*", "reports", False),
        ("report_*", "my_report_x", False),
        ("search_?", "search_1", True),
        ("search_?", "search_12", False),
        ("v[12]_*", "v2_run", True),
        ("v[12]_*", "v3_run", False),
        ("*", "anything at all", True),
        ("*.read", "file.read", True),
        ("*.read", "file.read.more", False),
    ],
)
def test_globs_match_whole_names(pattern: str, tool: str, matches: bool) -> None:
    routes = table(([pattern], "globbed"))

    assert (backend_of(routes, tool) == "globbed") is matches


def test_a_glob_route_before_an_exact_route_wins() -> None:
    routes = table((["report_*"], "glob"), (["report_x"], "exact"))

    route = routes.lookup("report_x", "acme")

    assert route is not None
    assert (route.index, route.backend) == (0, "glob")


def test_an_exact_route_before_a_glob_route_wins() -> None:
    routes = table((["report_x"], "exact"), (["report_*"], "glob"))

    assert backend_of(routes, "report_x") == "exact"
    assert backend_of(routes, "report_y") == "glob"


def test_the_earlier_of_two_globs_wins() -> None:
    routes = table((["re*"], "first"), (["report_*"], "second"))

    assert backend_of(routes, "report_x") == "first"


def test_the_earlier_of_two_exact_routes_wins() -> None:
    routes = table((["echo"], "first"), (["echo"], "second"))

    assert backend_of(routes, "echo") == "first"


def test_a_later_exact_route_does_not_beat_an_earlier_glob_among_many() -> None:
    routes = table((["a"], "r0"), (["x*"], "r1"), (["b"], "r2"), (["xy"], "r3"))

    assert backend_of(routes, "xy") == "r1"
    assert backend_of(routes, "b") == "r2"


def test_a_tool_no_route_exposes_has_no_route() -> None:
    routes = table((["echo"], "a"), (["report_*"], "b"))

    assert routes.lookup("search", "acme") is None
    assert routes.lookup("", "acme") is None
    assert routes.lookup("echo ", "acme") is None


@pytest.mark.parametrize("tool", ["ECHO", "Echo", "Report_x", "REPORT_X"])
def test_names_are_case_sensitive(tool: str) -> None:
    routes = table((["echo"], "a"), (["report_*"], "b"))

    assert routes.lookup(tool, "acme") is None


def test_the_memo_stays_bounded_and_answers_stay_right() -> None:
    routes = table((["exact"], "a"), (["tool_*"], "b"), memo_size=8)

    for n in range(2000):
        assert backend_of(routes, f"tool_{n}") == "b"
        assert backend_of(routes, f"other_{n}") is None
        assert len(routes._tools.memo) <= 8  # the only place the bound is visible

    assert backend_of(routes, "tool_0") == "b"  # evicted long ago, computed again
    assert backend_of(routes, "exact") == "a"


def test_a_zero_sized_memo_still_answers() -> None:
    routes = table((["tool_*"], "b"), memo_size=0)

    assert backend_of(routes, "tool_1") == "b"
    assert backend_of(routes, "tool_1") == "b"
    assert len(routes._tools.memo) == 0


def test_routes_keep_their_yaml_position() -> None:
    routes = table((["a"], "x"), (["b*", "c"], "y"))

    assert [(r.index, r.backend, r.tools) for r in routes.routes] == [
        (0, "x", ("a",)),
        (1, "y", ("b*", "c")),
    ]


def test_backends_are_listed_once_in_order_of_first_appearance() -> None:
    routes = table((["a"], "reports"), (["b"], "search"), (["c"], "reports"), (["d"], "admin"))

    assert routes.backends() == ["reports", "search", "admin"]


_patterns = st.text(alphabet="ab_*?", min_size=1, max_size=4)
_names = st.text(alphabet="abAB_", max_size=5)


@settings(max_examples=300, deadline=None)
@given(
    routes=st.lists(st.lists(_patterns, min_size=1, max_size=3), min_size=1, max_size=5),
    names=st.lists(_names, max_size=20),
    memo_size=st.integers(min_value=0, max_value=4),
)
def test_lookup_agrees_with_a_scan_in_yaml_order(
    routes: list[list[str]], names: list[str], memo_size: int
) -> None:
    compiled = table(*((tools, f"r{i}") for i, tools in enumerate(routes)), memo_size=memo_size)

    for name in names + names:  # the second pass reads the memo
        expected = next(
            (i for i, tools in enumerate(routes) if any(fnmatchcase(name, t) for t in tools)),
            None,
        )
        route = compiled.lookup(name, "acme")
        assert (None if route is None else route.index) == expected


# --- prompts, resources, resource templates: the same rules, per kind ----------------------


def kinds_table(*routes: RouteConfig, memo_size: int = 4096) -> RouteTable:
    return RouteTable(routes, memo_size=memo_size)


def index_of(route: Route | None) -> int | None:
    return None if route is None else route.index


def test_each_kind_has_its_own_first_match() -> None:
    routes = kinds_table(
        RouteConfig(tools=("summarize",), backend="tools-only"),
        RouteConfig(prompts=("summarize",), backend="prompts"),
        RouteConfig(prompts=("summarize", "report_*"), backend="later"),
        RouteConfig(resources=("reports://*",), backend="resources"),
        RouteConfig(resource_templates=("tmpl://{id}",), backend="templates"),
    )

    assert index_of(routes.lookup("summarize", "acme")) == 0
    assert index_of(routes.lookup_prompt("summarize", "acme")) == 1
    assert index_of(routes.lookup_prompt("report_x", "acme")) == 2
    assert index_of(routes.lookup_resource("reports://x", "acme")) == 3
    assert index_of(routes.lookup_template("tmpl://{id}", "acme")) == 4
    # a kind never answers for another
    assert routes.lookup("report_x", "acme") is None
    assert routes.lookup_prompt("reports://x", "acme") is None
    assert routes.lookup_resource("tmpl://{id}", "acme") is None
    assert routes.lookup_template("reports://x", "acme") is None


def test_a_prompt_glob_before_an_exact_prompt_wins() -> None:
    routes = kinds_table(
        RouteConfig(prompts=("report_*",), backend="glob"),
        RouteConfig(prompts=("report_x",), backend="exact"),
    )

    assert index_of(routes.lookup_prompt("report_x", "acme")) == 0


def test_every_kind_falls_through_a_route_hidden_from_the_tenant() -> None:
    routes = kinds_table(
        RouteConfig(
            tools=("report_*",),
            prompts=("report_*",),
            resources=("reports://acme/*",),
            resource_templates=("reports://acme/{id}",),
            backend="acme-only",
            tenants=("acme",),
        ),
        RouteConfig(
            tools=("report_*",),
            prompts=("report_*",),
            resources=("reports://*",),
            resource_templates=("reports://acme/{id}",),
            backend="shared",
        ),
    )
    lookups = [
        (routes.lookup, "report_x"),
        (routes.lookup_prompt, "report_x"),
        (routes.lookup_resource, "reports://acme/1"),
        (routes.lookup_template, "reports://acme/{id}"),
    ]

    for lookup, key in lookups:
        assert index_of(lookup(key, "acme")) == 0
        assert index_of(lookup(key, "globex")) == 1


def test_a_route_hidden_from_the_tenant_with_nothing_after_it_hides_every_kind() -> None:
    routes = kinds_table(
        RouteConfig(
            prompts=("secret",),
            resources=("vault://*",),
            resource_templates=("vault://{key}",),
            backend="vault",
            tenants=("globex",),
        )
    )

    assert routes.lookup_prompt("secret", "acme") is None
    assert routes.lookup_resource("vault://k", "acme") is None
    assert routes.lookup_template("vault://{key}", "acme") is None
    assert index_of(routes.lookup_prompt("secret", "globex")) == 0


@pytest.mark.parametrize(
    ("pattern", "uri", "matches"),
    [
        ("reports://acme/*", "reports://acme/2024/q1", True),  # * spans '/'
        ("reports://acme/*", "reports://acme/", True),
        ("reports://acme/*", "reports://acme", False),
        ("reports://acme/*", "reports://acme2/x", False),
        ("reports://acme/*", "reports://acmex", False),
        ("reports://acme/*", "REPORTS://acme/x", False),  # case-sensitive, as strings
        ("reports://acme/*", "reports://acme/x?tenant=globex#top", True),
        ("reports://*/q1", "reports://acme/2024/q1", True),
        ("reports://acme/*.csv", "reports://acme/a/b.csv", True),
        ("reports://acme/*.csv", "reports://acme/a/b.csv.gz", False),
        ("search://q?x=1", "search://q?x=1", True),  # ? is a query, not a wildcard
        ("search://q?x=1", "search://qax=1", False),
        ("search://q?x=*", "search://q?x=42&y=2", True),
        ("http://[::1]/*", "http://[::1]/mcp", True),  # [ is a character, not a class
        ("http://[::1]/*", "http://:/mcp", False),
        ("data:*", "data:text/plain,hi", True),
    ],
)
def test_resource_globs_match_whole_uris(pattern: str, uri: str, matches: bool) -> None:
    routes = kinds_table(RouteConfig(resources=(pattern,), backend="b"))

    assert (routes.lookup_resource(uri, "acme") is not None) is matches


@pytest.mark.parametrize(
    "uri",
    [
        "reports://acme/../globex/q1",
        "reports://acme/2024/..",
        "reports://acme/./x",
        "reports://acme/%2e%2e/globex",
        "reports://acme/%2E./globex",
        "reports://acme/..?x=1",
        "reports://acme/x\\..\\globex",
    ],
)
def test_a_resource_glob_never_matches_a_dot_segment(uri: str) -> None:
    routes = kinds_table(
        RouteConfig(resources=("reports://acme/*",), backend="acme", tenants=("acme",))
    )

    assert routes.lookup_resource(uri, "acme") is None


def test_dots_inside_a_segment_are_no_dot_segment() -> None:
    routes = kinds_table(RouteConfig(resources=("reports://acme/*",), backend="acme"))

    for uri in ("reports://acme/a..b", "reports://acme/.hidden", "reports://acme/v1.2/x..."):
        assert routes.lookup_resource(uri, "acme") is not None, uri


def test_an_exact_resource_uri_matches_only_itself_dots_and_all() -> None:
    routes = kinds_table(
        RouteConfig(resources=("file:///srv/../etc/motd", "search://q?x=1"), backend="b")
    )

    assert routes.lookup_resource("file:///srv/../etc/motd", "acme") is not None
    assert routes.lookup_resource("search://q?x=1", "acme") is not None
    assert routes.lookup_resource("search://q?x=2", "acme") is None


def test_the_earlier_of_two_resource_globs_wins_and_an_exact_uri_after_them_loses() -> None:
    routes = kinds_table(
        RouteConfig(resources=("reports://acme/*",), backend="acme"),
        RouteConfig(resources=("reports://*",), backend="all"),
        RouteConfig(resources=("reports://acme/q1",), backend="exact"),
    )

    assert index_of(routes.lookup_resource("reports://acme/q1", "acme")) == 0
    assert index_of(routes.lookup_resource("reports://globex/q1", "acme")) == 1


@pytest.mark.parametrize(
    ("exposed", "asked", "matches"),
    [
        ("reports://acme/{id}", "reports://acme/{id}", True),
        ("reports://acme/{id}", "reports://acme/42", False),  # a template is not a URI glob
        ("reports://acme/{id}", "reports://acme/{ id}", False),
        ("reports://acme/{id}", "reports://acme/{name}", False),
        ("file:///{+path}", "file:///{+path}", True),
        ("file:///{path*}", "file:///{path*}", True),  # a * inside {..} is the explode modifier
        ("file:///{path*}", "file:///{pathx}", False),
        ("reports://*/{id}", "reports://acme/{id}", True),  # a * outside {..} is a glob
        ("reports://*/{id}", "reports://acme/{name}", False),
        ("file:///{path}*", "file:///{path}/x{?q}", True),
        ("file:///{path}*", "file:///{+path}", False),
        ("db://*", "db://{schema}/{table}", True),
        ("db://*", "db://{schema}/../{table}", False),  # a glob's rule: no dot segment
        ("*", "db://{schema}/../{table}", True),  # `*` alone is every template
        ("*", "x:{a}", True),
    ],
)
def test_templates_match_as_strings_exactly_or_by_glob(
    exposed: str, asked: str, matches: bool
) -> None:
    routes = kinds_table(RouteConfig(resource_templates=(exposed,), backend="b"))

    assert (routes.lookup_template(asked, "acme") is not None) is matches


def test_the_resource_memo_stays_bounded_and_long_uris_are_not_remembered() -> None:
    routes = kinds_table(RouteConfig(resources=("reports://*",), backend="b"), memo_size=8)

    for n in range(500):
        assert routes.lookup_resource(f"reports://{n}", "acme") is not None
        assert routes.lookup_resource(f"other://{n}", "acme") is None
        assert len(routes._resources.memo) <= 8
    long = "reports://" + "x" * 100_000
    assert routes.lookup_resource(long, "acme") is not None
    assert long not in routes._resources.memo


def test_a_long_tool_name_is_answered_but_not_remembered() -> None:
    routes = table((["tool_*"], "b"))
    long = "tool_" + "x" * 10_000

    assert backend_of(routes, long) == "b"
    assert long not in routes._tools.memo
    assert backend_of(routes, "tool_1") == "b"
    assert "tool_1" in routes._tools.memo


def test_routes_keep_every_kind() -> None:
    (route,) = kinds_table(
        RouteConfig(
            prompts=("p",),
            resources=("r://*",),
            resource_templates=("r://{x}",),
            backend="b",
            tenants=("acme",),
        )
    ).routes

    assert (route.tools, route.prompts, route.resources, route.resource_templates) == (
        (),
        ("p",),
        ("r://*",),
        ("r://{x}",),
    )
    assert route.tenants == frozenset({"acme"})


@settings(max_examples=300, deadline=None)
@given(
    routes=st.lists(st.lists(_patterns, min_size=1, max_size=3), min_size=1, max_size=5),
    names=st.lists(_names, max_size=20),
    memo_size=st.integers(min_value=0, max_value=4),
)
def test_prompt_lookup_agrees_with_a_scan_in_yaml_order(
    routes: list[list[str]], names: list[str], memo_size: int
) -> None:
    compiled = RouteTable(
        tuple(RouteConfig(prompts=tuple(p), backend=f"r{i}") for i, p in enumerate(routes)),
        memo_size=memo_size,
    )

    for name in names + names:
        expected = next(
            (i for i, prompts in enumerate(routes) if any(fnmatchcase(name, p) for p in prompts)),
            None,
        )
        assert index_of(compiled.lookup_prompt(name, "acme")) == expected


def star_match(pattern: str, uri: str) -> bool:
    """A reference matcher for `*`-only globs: the pieces between stars, in order."""
    first, *middle, last = pattern.split("*") if "*" in pattern else (pattern, pattern)
    if "*" not in pattern:
        return pattern == uri
    if not uri.startswith(first) or len(uri) < len(first) + len(last):
        return False
    at = len(first)
    for piece in middle:
        found = uri.find(piece, at, len(uri) - len(last))
        if found < 0:
            return False
        at = found + len(piece)
    return uri.endswith(last)


_uri_patterns = st.text(alphabet="ab/?[*", max_size=5).map(lambda rest: "s:" + rest)
_uris = st.text(alphabet="ab/?[", max_size=6).map(lambda rest: "s:" + rest)


@settings(max_examples=300, deadline=None)
@given(
    routes=st.lists(st.lists(_uri_patterns, min_size=1, max_size=3), min_size=1, max_size=5),
    uris=st.lists(_uris, max_size=20),
    memo_size=st.integers(min_value=0, max_value=4),
)
def test_resource_lookup_agrees_with_a_scan_in_yaml_order(
    routes: list[list[str]], uris: list[str], memo_size: int
) -> None:
    compiled = RouteTable(
        tuple(RouteConfig(resources=tuple(r), backend=f"r{i}") for i, r in enumerate(routes)),
        memo_size=memo_size,
    )

    for uri in uris + uris:
        expected = next(
            (i for i, globs in enumerate(routes) if any(star_match(g, uri) for g in globs)),
            None,
        )
        assert index_of(compiled.lookup_resource(uri, "acme")) == expected
