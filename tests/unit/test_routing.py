"""Tool name -> backend: exact names and globs, the first matching route in YAML order wins."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config import RouteConfig
from gateway.routing.table import RouteTable


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
        assert len(routes._memo) <= 8  # the only place the bound is visible

    assert backend_of(routes, "tool_0") == "b"  # evicted long ago, computed again
    assert backend_of(routes, "exact") == "a"


def test_a_zero_sized_memo_still_answers() -> None:
    routes = table((["tool_*"], "b"), memo_size=0)

    assert backend_of(routes, "tool_1") == "b"
    assert backend_of(routes, "tool_1") == "b"
    assert len(routes._memo) == 0


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
