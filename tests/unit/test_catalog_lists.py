"""The merged prompts, resources and templates lists: what each tenant sees, in which order, and
taskgate's own pages over them."""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from typing import Any, cast

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.catalog.discovery import Catalog, exposed, list_result
from gateway.catalog.pages import decode_cursor, encode_cursor
from gateway.catalog.table import RouteTable
from gateway.catalog.views import PROMPTS, RESOURCES, TEMPLATES, BackendView, ListKind
from gateway.config import DiscoveryConfig, RouteConfig
from gateway.errors import BadCursor
from gateway.protocol.codes import Code
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend

TTL_MS = 30_000


def prompt(name: str) -> dict[str, Any]:
    return {"name": name, "description": f"the {name} prompt", "arguments": []}


def resource(uri: str) -> dict[str, Any]:
    return {"uri": uri, "name": uri.rpartition("/")[2], "mimeType": "text/plain"}


def template(uri_template: str) -> dict[str, Any]:
    return {"uriTemplate": uri_template, "name": "by id"}


def view(
    prompts: Sequence[str] = (), resources: Sequence[str] = (), templates: Sequence[str] = ()
) -> BackendView:
    return BackendView(
        discover={"capabilities": {"prompts": {}, "resources": {}}},
        tools={},
        fetched_at=time.monotonic(),
        prompts={name: prompt(name) for name in prompts},
        resources={uri: resource(uri) for uri in resources},
        templates={t: template(t) for t in templates},
    )


def route(
    backend: str,
    tenants: tuple[str, ...] | None = None,
    *,
    prompts: tuple[str, ...] = (),
    resources: tuple[str, ...] = (),
    resource_templates: tuple[str, ...] = (),
) -> RouteConfig:
    return RouteConfig(
        backend=backend,
        tenants=tenants,
        prompts=prompts,
        resources=resources,
        resource_templates=resource_templates,
    )


def keys(kind: ListKind, result: dict[str, Any]) -> list[str]:
    return [item[kind.key] for item in result[kind.field]]


def listed(
    kind: ListKind,
    views: dict[str, BackendView],
    table: RouteTable,
    tenant: str,
    *,
    page_size: int = 100,
    cursor: object = None,
) -> dict[str, Any]:
    entries = exposed(kind, views, table, tenant)
    return list_result(kind, entries, decode_cursor(kind.name, cursor), page_size, TTL_MS)


def follow(
    kind: ListKind, views: dict[str, BackendView], table: RouteTable, tenant: str, page_size: int
) -> list[dict[str, Any]]:
    """Every page of a list, following nextCursor until it is absent."""
    pages = [listed(kind, views, table, tenant, page_size=page_size)]
    while "nextCursor" in pages[-1]:
        cursor = pages[-1]["nextCursor"]
        pages.append(listed(kind, views, table, tenant, page_size=page_size, cursor=cursor))
        assert len(pages) <= 1000, "the cursor chain does not end"
    return pages


def test_only_routed_items_that_the_backend_serves_are_listed_by_route_then_name() -> None:
    views = {
        "a": view(prompts=["zeta", "alpha", "unrouted", "summarize"]),
        "b": view(prompts=["report_b", "report_a", "alpha"]),
    }
    table = RouteTable(
        (
            route("b", prompts=("report_*",)),
            route("a", prompts=("summarize", "alpha", "zeta", "missing")),
        )
    )
    result = listed(PROMPTS, views, table, "acme")
    # b's alpha is not listed: alpha's route names backend a, which serves its own alpha.
    assert keys(PROMPTS, result) == ["report_a", "report_b", "alpha", "summarize", "zeta"]
    assert result["prompts"][2] is views["a"].prompts["alpha"]  # the backend's object, untouched


def test_every_page_is_private_complete_and_carries_a_ttl() -> None:
    views = {"a": view(prompts=[f"p{i:02}" for i in range(5)])}
    table = RouteTable((route("a", prompts=("*",)),))
    for result in follow(PROMPTS, views, table, "acme", page_size=2):
        assert result["resultType"] == "complete"
        assert result["cacheScope"] == "private"
        assert result["ttlMs"] == TTL_MS


def test_a_short_list_has_no_next_cursor_and_an_empty_one_lists_nothing() -> None:
    table = RouteTable((route("a", prompts=("*",)),))
    short = listed(PROMPTS, {"a": view(prompts=["one"])}, table, "acme")
    assert keys(PROMPTS, short) == ["one"]
    assert "nextCursor" not in short
    empty = listed(PROMPTS, {"a": view()}, table, "acme")
    assert empty["prompts"] == []
    assert "nextCursor" not in empty


def test_a_tenant_route_is_invisible_to_others_who_fall_through_to_a_later_route() -> None:
    views = {
        "acme-only": view(prompts=["report_q1", "report_secret"]),
        "shared": view(prompts=["report_q1"]),
    }
    table = RouteTable(
        (
            route("acme-only", ("acme",), prompts=("report_*",)),
            route("shared", prompts=("report_*",)),
        )
    )
    acme = listed(PROMPTS, views, table, "acme")
    globex = listed(PROMPTS, views, table, "globex")
    assert keys(PROMPTS, acme) == ["report_q1", "report_secret"]
    assert acme["prompts"][0] is views["acme-only"].prompts["report_q1"]
    assert keys(PROMPTS, globex) == ["report_q1"]
    assert globex["prompts"][0] is views["shared"].prompts["report_q1"]


def test_resources_follow_uri_globs_and_templates_their_exact_strings() -> None:
    views = {
        "reports": view(
            resources=["reports://acme/2024/q1", "reports://globex/q1", "reports://acme/../x"],
            templates=["reports://acme/{id}", "reports://globex/{id}"],
        )
    }
    table = RouteTable(
        (
            route(
                "reports",
                ("acme",),
                resources=("reports://acme/*",),
                resource_templates=("reports://acme/{id}",),
            ),
        )
    )
    assert keys(RESOURCES, listed(RESOURCES, views, table, "acme")) == ["reports://acme/2024/q1"]
    templates = listed(TEMPLATES, views, table, "acme")
    assert list(templates) == ["resultType", "resourceTemplates", "ttlMs", "cacheScope", "_meta"]
    assert keys(TEMPLATES, templates) == ["reports://acme/{id}"]
    for kind in (PROMPTS, RESOURCES, TEMPLATES):
        assert listed(kind, views, table, "globex")[kind.field] == []


@pytest.mark.parametrize(("count", "page_size"), [(250, 100), (200, 100), (7, 1), (3, 1000)])
def test_following_next_cursor_yields_every_item_exactly_once(count: int, page_size: int) -> None:
    views = {
        "a": view(resources=[f"data://a/{i:04}" for i in range(0, count, 2)]),
        "b": view(resources=[f"data://b/{i:04}" for i in range(1, count, 2)]),
    }
    table = RouteTable((route("b", resources=("data://b/*",)), route("a", resources=("data://*",))))
    pages = follow(RESOURCES, views, table, "acme", page_size)
    uris = [uri for result in pages for uri in keys(RESOURCES, result)]
    expected = [f"data://b/{i:04}" for i in range(1, count, 2)]
    expected += [f"data://a/{i:04}" for i in range(0, count, 2)]
    assert uris == expected
    assert len(pages) == max(1, -(-count // page_size))
    assert all(len(result["resources"]) == page_size for result in pages[:-1])


def test_a_cursor_continues_after_its_item_even_when_the_list_changed() -> None:
    table = RouteTable((route("a", prompts=("*",)),))
    before = {"a": view(prompts=["a", "b", "c", "d"])}
    first = listed(PROMPTS, before, table, "acme", page_size=2)
    assert keys(PROMPTS, first) == ["a", "b"]
    after = {"a": view(prompts=["a", "b2", "c", "d"])}  # b went away, b2 came
    second = listed(PROMPTS, after, table, "acme", page_size=2, cursor=first["nextCursor"])
    assert keys(PROMPTS, second) == ["b2", "c"]


def tenant_views() -> tuple[dict[str, BackendView], RouteTable]:
    views = {
        "globex-only": view(prompts=["g_secret", "a_secret", "zz_secret"]),
        "acme-only": view(prompts=["a_mine", "m_mine"]),
        "shared": view(prompts=["s_one", "s_two"]),
    }
    table = RouteTable(
        (
            route("globex-only", ("globex",), prompts=("*_secret",)),
            route("acme-only", ("acme",), prompts=("*_mine",)),
            route("shared", prompts=("s_*",)),
        )
    )
    return views, table


@settings(max_examples=300, deadline=None)
@given(index=st.integers(min_value=0, max_value=5), key=st.text(max_size=12))
def test_a_forged_cursor_only_skips_within_the_callers_own_items(index: int, key: str) -> None:
    views, table = tenant_views()
    visible = {"a_mine", "m_mine", "s_one", "s_two"}
    forged = encode_cursor("prompts", (index, key))
    result = listed(PROMPTS, views, table, "acme", page_size=2, cursor=forged)
    assert set(keys(PROMPTS, result)) <= visible
    while "nextCursor" in result:
        result = listed(PROMPTS, views, table, "acme", page_size=2, cursor=result["nextCursor"])
        assert set(keys(PROMPTS, result)) <= visible


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "!!!",
        "not a cursor",
        "a",  # one base64 character decodes to nothing
        encode_cursor("prompts", (0, "x")) + "=",
        b64(b"\xff\xfe"),
        b64(b"[]"),
        b64(b'{"v":1,"list":"prompts"}'),
        b64(b'{"v":2,"list":"prompts","after":[0,"x"]}'),
        b64(b'{"v":1,"list":"prompts","after":[-1,"x"]}'),
        b64(b'{"v":1,"list":"prompts","after":[true,"x"]}'),
        b64(b'{"v":1,"list":"prompts","after":[0,1]}'),
        b64(b'{"v":1,"list":"prompts","after":[0,"x",1]}'),
        encode_cursor("resources", (0, "x")),  # another list's cursor
        encode_cursor("templates", (0, "x")),
        17,
        ["a"],
    ],
)
def test_a_cursor_taskgate_did_not_issue_for_this_list_is_refused(cursor: object) -> None:
    with pytest.raises(BadCursor) as caught:
        decode_cursor("prompts", cursor)
    assert caught.value.code == Code.INVALID_PARAMS
    assert caught.value.status == 200
    assert caught.value.message == "Invalid params: cursor is not one taskgate issued"


def test_a_cursor_is_url_safe_text_naming_its_list_and_last_key() -> None:
    cursor = encode_cursor("resources", (3, "data://ä/?x=1"))
    assert cursor.isascii()
    assert "=" not in cursor
    assert orjson.loads(base64.urlsafe_b64decode(cursor + "==")) == {
        "v": 1,
        "list": "resources",
        "after": [3, "data://ä/?x=1"],
    }
    assert decode_cursor("resources", cursor) == (3, "data://ä/?x=1")


def test_the_page_size_is_bounded_and_defaults_to_100() -> None:
    assert DiscoveryConfig().page_size == 100
    for bad in (0, 1001):
        with pytest.raises(ValueError, match="page_size"):
            DiscoveryConfig(page_size=bad)


def catalog(views: dict[str, BackendView], table: RouteTable, *, page_size: int) -> Catalog:
    """A catalogue holding fresh `views`, which neither refreshes nor looks again for a miss."""
    backends = cast(dict[str, Backend], dict.fromkeys(views))
    made = Catalog(cast(Pool, None), backends, table, refresh_s=3600, page_size=page_size)
    for name, seen in views.items():
        slot = made._slots[name]
        slot.view = seen
        slot.last_attempt = time.monotonic()  # a miss does not trigger a look for a while
    return made


async def test_the_catalog_pages_each_list_for_the_caller() -> None:
    views, table = tenant_views()
    made = catalog(views, table, page_size=3)
    first = await made.prompts_result("acme")
    assert keys(PROMPTS, first) == ["a_mine", "m_mine", "s_one"]
    assert first["ttlMs"] == 3_600_000
    second = await made.prompts_result("acme", first["nextCursor"])
    assert keys(PROMPTS, second) == ["s_two"]
    assert "nextCursor" not in second
    assert (await made.resources_result("acme"))["resources"] == []
    assert (await made.templates_result("acme"))["resourceTemplates"] == []
    with pytest.raises(BadCursor):
        await made.resources_result("acme", first["nextCursor"])


async def test_a_bad_cursor_is_refused_before_any_backend_is_asked() -> None:
    _, table = tenant_views()
    made = catalog({}, table, page_size=3)  # no view at all: a look would fail loudly
    with pytest.raises(BadCursor):
        await made.prompts_result("acme", "garbage")


async def test_the_catalog_knows_each_backends_items() -> None:
    views = {
        "a": view(prompts=["p"], resources=["data://x"], templates=["data://{id}"]),
        "b": view(),
    }
    made = catalog(views, RouteTable((route("a", prompts=("*",)),)), page_size=10)
    assert await made.knows_prompt("a", "p") is True
    assert await made.knows_prompt("b", "p") is False
    assert await made.knows_resource("a", "data://x") is True
    assert await made.knows_resource("a", "data://y") is False
    assert await made.knows_template("a", "data://{id}") is True
    assert await made.knows_template("a", "data://x") is False


async def test_serves_needs_a_route_of_the_kind_and_a_backend_advertising_it() -> None:
    silent = BackendView(
        discover={"capabilities": {"tools": {}}}, tools={}, fetched_at=time.monotonic()
    )
    views = {"a": view(prompts=["p"])}

    prompts_only = catalog(views, RouteTable((route("a", prompts=("*",)),)), page_size=10)
    assert await prompts_only.serves("prompts") is True
    assert await prompts_only.serves("resources") is False  # a advertises it; no route names any

    templates = RouteTable((route("a", resource_templates=("data://{id}",)),))
    assert await catalog(views, templates, page_size=10).serves("resources") is True

    quiet = RouteTable((route("quiet", prompts=("*",), resources=("data://*",)),))
    unadvertised = catalog({"quiet": silent}, quiet, page_size=10)
    assert await unadvertised.serves("prompts") is False
    assert await unadvertised.serves("resources") is False
