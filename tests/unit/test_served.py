"""What discovery says of the items backends really serve: shadowed, or served by two."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.catalog.served import served_warnings
from gateway.catalog.table import RouteTable
from gateway.config import Config, RouteConfig, load_config
from gateway.process.cli import template_warnings

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"


def table(*routes: tuple[str, tuple[str, ...] | None, tuple[str, ...]]) -> RouteTable:
    """Prompt routes: (backend, tenants, prompt patterns)."""
    return RouteTable(tuple(RouteConfig(backend=b, tenants=t, prompts=p) for b, t, p in routes))


def prompts(**served: set[str]) -> dict[str, dict[str, set[str]]]:
    return {"prompts": served}


def test_one_backend_per_item_says_nothing() -> None:
    routes = table(("a", None, ("x",)), ("b", None, ("y",)))
    assert served_warnings(routes, prompts(a={"x", "y"}, b={"y"})) == []


def test_a_route_the_earlier_ones_win_for_all_its_tenants_is_shadowed() -> None:
    routes = table(("a", ("t1",), ("x",)), ("a", ("t2",), ("x*",)), ("b", ("t1", "t2"), ("x",)))
    assert served_warnings(routes, prompts(a={"x"}, b={"x"})) == [
        "prompt 'x' of backend 'b' is shadowed: routes[2] never reaches it, "
        "routes[0] (backend 'a') matches it first"
    ]


def test_a_route_another_tenant_still_reaches_is_not_shadowed_but_the_item_has_two_backends() -> (
    None
):
    routes = table(("a", ("t1",), ("x",)), ("b", None, ("x",)))
    assert served_warnings(routes, prompts(a={"x"}, b={"x"})) == [
        "prompt 'x' is served by backends 'a' and 'b': "
        "routes[0] to 'a' for tenants t1; routes[1] to 'b' for every tenant"
    ]


def test_a_winner_whose_backend_lacks_the_item_hides_it_and_says_so() -> None:
    routes = table(("a", None, ("x*",)), ("b", None, ("x1",)))
    assert served_warnings(routes, prompts(a=set(), b={"x1"})) == [
        "prompt 'x1' of backend 'b' is shadowed: routes[1] never reaches it, "
        "routes[0] (backend 'a') matches it first, whose backend does not serve it"
    ]


def test_an_item_only_an_unserving_backends_route_names_is_not_reported() -> None:
    routes = table(("a", None, ("x",)))
    assert served_warnings(routes, prompts(b={"x"})) == []


def test_templates_are_compared_as_strings() -> None:
    routes = RouteTable(
        (
            RouteConfig(backend="a", resource_templates=("r://{id}",)),
            RouteConfig(backend="b", resource_templates=("r://{id}",)),
        )
    )
    served = {"resource_templates": {"a": {"r://{id}"}, "b": {"r://{id}"}}}
    assert served_warnings(routes, served) == [
        "resource template 'r://{id}' of backend 'b' is shadowed: routes[1] never reaches it, "
        "routes[0] (backend 'a') matches it first"
    ]


def test_a_scan_does_not_evict_what_the_hot_path_remembers() -> None:
    routes = RouteTable((RouteConfig(backend="a", tools=("t*",)),), memo_size=2)
    routes.lookup("t1", "any")
    served_warnings(routes, {"tools": {"a": {f"t{n}" for n in range(10)}}})
    assert list(routes._tools.memo) == ["t1"]


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.yaml")), ids=lambda path: path.name)
def test_the_shipped_configurations_have_no_refused_templates(path: Path) -> None:
    assert template_warnings(load_config(path)) == []


def test_check_names_a_template_the_matcher_refuses() -> None:
    config = Config.model_validate(
        {
            "store": {"url": "sqlite:///:memory:"},
            "backends": {"a": {"replicas": ["http://127.0.0.1:9/mcp"]}},
            "routes": [{"backend": "a", "resource_templates": ["r://{ok}", "r://{a}{b}"]}],
        }
    )
    (warning,) = template_warnings(config)
    assert warning.startswith("routes[0].resource_templates[1] 'r://{a}{b}': two variables")
    assert warning.endswith(
        "resources/read reaches no URI through it (completion/complete and the list still do)"
    )
