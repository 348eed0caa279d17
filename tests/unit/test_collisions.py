"""Route collisions: items an earlier route always wins, and broad routes exposing tenant items."""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.catalog.collisions import collisions
from gateway.config import RouteConfig, load_config

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"


def route(
    backend: str = "b",
    tenants: tuple[str, ...] | None = None,
    *,
    tools: tuple[str, ...] = (),
    prompts: tuple[str, ...] = (),
    resources: tuple[str, ...] = (),
    resource_templates: tuple[str, ...] = (),
) -> RouteConfig:
    return RouteConfig(
        backend=backend,
        tenants=tenants,
        tools=tools,
        prompts=prompts,
        resources=resources,
        resource_templates=resource_templates,
    )


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.yaml")), ids=lambda path: path.name)
def test_the_shipped_configurations_have_no_collisions(path: Path) -> None:
    assert collisions(load_config(path).routes) == []


def test_distinct_items_do_not_collide() -> None:
    assert (
        collisions(
            (
                route(tools=("echo", "report_*"), prompts=("summarize",)),
                route(tools=("search_*",), prompts=("draft",), resources=("r://a/*",)),
                route(resources=("r://b/*",), resource_templates=("r://a/{id}",)),
            )
        )
        == []
    )


def test_the_same_name_in_two_kinds_does_not_collide() -> None:
    assert collisions((route(tools=("summarize",)), route(prompts=("summarize",)))) == []


# --- shadowed: certain, never guessed -------------------------------------------------------


def test_an_exact_duplicate_is_shadowed() -> None:
    assert collisions((route(tools=("echo",)), route("other", tools=("whoami", "echo")))) == [
        "routes[1].tools[1] 'echo' is shadowed: routes[0].tools[0] 'echo' matches it first"
    ]


def test_an_exact_name_an_earlier_glob_matches_is_shadowed() -> None:
    assert collisions((route(prompts=("sum*",)), route(prompts=("summarize",)))) == [
        "routes[1].prompts[0] 'summarize' is shadowed: routes[0].prompts[0] 'sum*' matches it first"
    ]


def test_a_glob_inside_an_earlier_prefix_glob_is_shadowed() -> None:
    assert collisions((route(resources=("r://a/*",)), route(resources=("r://a/b/*.csv",)))) == [
        "routes[1].resources[0] 'r://a/b/*.csv' is shadowed: "
        "routes[0].resources[0] 'r://a/*' matches it first"
    ]


def test_a_duplicate_template_is_shadowed() -> None:
    assert collisions(
        (route(resource_templates=("r://{id}",)), route(resource_templates=("r://{id}",)))
    ) == [
        "routes[1].resource_templates[0] 'r://{id}' is shadowed: "
        "routes[0].resource_templates[0] 'r://{id}' matches it first"
    ]


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ("r*port_*", "report_x*"),  # covers it, but not by the simple rule: not claimed
        ("report_?", "report_*"),
        ("a*", "b"),
    ],
)
def test_only_certain_shadowing_is_claimed(earlier: str, later: str) -> None:
    found = collisions((route(tools=(earlier,)), route(tools=(later,))))

    assert not any("shadowed" in message for message in found)


def test_a_uri_with_a_dot_segment_is_not_shadowed_by_a_glob_that_never_matches_it() -> None:
    assert collisions((route(resources=("r://a/*",)), route(resources=("r://a/../b",)))) == []


def test_an_earlier_route_shadows_only_for_tenants_it_serves() -> None:
    acme = route("acme", ("acme",), tools=("echo",))

    assert collisions((acme, route(tenants=("acme",), tools=("echo",))))[0].endswith(
        "matches it first"
    )
    assert collisions((route(tenants=("acme", "globex"), tools=("echo",)), acme))[0].endswith(
        "matches it first"
    )
    assert not any(
        "shadowed" in message
        for message in collisions((acme, route("acme", ("acme", "globex"), tools=("echo",))))
    )
    assert not any("shadowed" in m for m in collisions((acme, route("acme", tools=("echo",)))))


def test_items_of_one_route_do_not_shadow_each_other() -> None:
    assert collisions((route(tools=("report_*", "report_x", "report_x")),)) == []


# --- exposed: a broad route after a tenant route ------------------------------------------


def test_a_broad_glob_after_a_tenant_name_exposes_it() -> None:
    routes = (
        route("reports", ("acme",), prompts=("report_acme",)),
        route("search", prompts=("search",)),
        route("reports", prompts=("report_*",)),
    )

    assert collisions(routes) == [
        "routes[2].prompts[0] 'report_*' would expose to every tenant what "
        "routes[0].prompts[0] 'report_acme' keeps to tenants acme"
    ]


def test_the_surface_listen_caveat_is_flagged() -> None:
    routes = (
        route("data", ("acme",), resources=("data://acme/*",)),
        route("data", resources=("data://*",)),
    )

    assert collisions(routes) == [
        "routes[1].resources[0] 'data://*' would expose to every tenant what "
        "routes[0].resources[0] 'data://acme/*' keeps to tenants acme"
    ]


def test_a_broad_route_to_another_backend_says_which() -> None:
    routes = (
        route("acme-reports", ("acme", "initech"), tools=("report_*",)),
        route("shared", tools=("report_*",)),
    )

    assert collisions(routes) == [
        "routes[1].tools[0] 'report_*' would expose to every tenant what routes[0].tools[0] "
        "'report_*' keeps to tenants acme, initech (through backend 'shared', not 'acme-reports')"
    ]


def test_two_globs_that_share_a_name_overlap() -> None:
    found = collisions((route(tenants=("acme",), tools=("*_x",)), route(tools=("report_*",))))

    assert found == [
        "routes[1].tools[0] 'report_*' would expose to every tenant what "
        "routes[0].tools[0] '*_x' keeps to tenants acme"
    ]


@pytest.mark.parametrize(
    ("kept", "broad"),
    [("report_*", "search_*"), ("a*b", "a*c"), ("report_acme", "report_globex")],
)
def test_patterns_that_share_no_name_do_not_overlap(kept: str, broad: str) -> None:
    assert collisions((route(tenants=("acme",), prompts=(kept,)), route(prompts=(broad,)))) == []


def test_a_same_backend_route_for_other_tenants_exposes_too() -> None:
    routes = (
        route("data", ("acme",), resources=("data://acme/*",)),
        route("data", ("acme", "globex"), resources=("data://*",)),
    )

    assert collisions(routes) == [
        "routes[1].resources[0] 'data://*' would expose to tenants globex what "
        "routes[0].resources[0] 'data://acme/*' keeps to tenants acme"
    ]


def test_per_tenant_routes_to_their_own_backends_are_deliberate() -> None:
    routes = (
        route("acme-reports", ("acme",), tools=("report_*",)),
        route("globex-reports", ("globex",), tools=("report_*",)),
    )

    assert collisions(routes) == []


def test_a_broad_route_before_the_tenant_route_is_no_exposure() -> None:
    routes = (route(resources=("data://*",)), route(tenants=("acme",), resources=("data://a/*",)))

    assert collisions(routes) == [
        "routes[1].resources[0] 'data://a/*' is shadowed: "
        "routes[0].resources[0] 'data://*' matches it first"
    ]


def test_a_shadowed_item_exposes_nothing() -> None:
    routes = (
        route(tenants=("acme",), prompts=("summarize",)),
        route(prompts=("sum*",)),
        route(prompts=("summarize",)),
    )

    assert collisions(routes) == [
        "routes[1].prompts[0] 'sum*' would expose to every tenant what "
        "routes[0].prompts[0] 'summarize' keeps to tenants acme",
        "routes[2].prompts[0] 'summarize' is shadowed: "
        "routes[1].prompts[0] 'sum*' matches it first",
    ]


def test_a_route_kept_to_no_tenant_says_so() -> None:
    found = collisions((route(tenants=(), tools=("x",)), route(tools=("x",))))

    assert found == [
        "routes[1].tools[0] 'x' would expose to every tenant what "
        "routes[0].tools[0] 'x' keeps to no tenant"
    ]


def test_findings_come_in_yaml_order_of_the_later_item() -> None:
    routes = (
        route(tenants=("acme",), tools=("t",), prompts=("p",), resources=("r://a",)),
        route(resources=("r://a",)),
        route(prompts=("p",), tools=("t",)),
    )

    assert [message.split(" ")[0] for message in collisions(routes)] == [
        "routes[1].resources[0]",
        "routes[2].tools[0]",
        "routes[2].prompts[0]",
    ]


# --- properties: shadowing is never claimed falsely, overlaps are never missed -------------

_patterns = st.text(alphabet="ab*?[]!", min_size=1, max_size=5)
_names = st.text(alphabet="ab[]!", max_size=6)


@settings(max_examples=400, deadline=None)
@given(earlier=_patterns, later=_patterns, names=st.lists(_names, max_size=30))
def test_a_shadowed_pattern_matches_nothing_the_earlier_one_does_not(
    earlier: str, later: str, names: list[str]
) -> None:
    found = collisions((route(tools=(earlier,)), route(tools=(later,))))

    if found:
        for name in names:
            assert not fnmatchcase(name, later) or fnmatchcase(name, earlier), found


@settings(max_examples=400, deadline=None)
@given(kept=_patterns, broad=_patterns, names=st.lists(_names, max_size=30))
def test_patterns_sharing_a_name_are_always_flagged(
    kept: str, broad: str, names: list[str]
) -> None:
    found = collisions((route(tenants=("acme",), prompts=(kept,)), route(prompts=(broad,))))

    if any(fnmatchcase(name, kept) and fnmatchcase(name, broad) for name in names):
        assert len(found) == 1
        assert "would expose to every tenant" in found[0]
