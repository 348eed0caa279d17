"""Prompts and the lists of prompts, resources and templates through taskgate, against the two
report replicas, for two tenants with JWT: what taskgate lists is the routed subset of what the
backend lists, paged by taskgate; prompts/get is the backend's answer as it sent it; a prompt
hidden from a tenant answers exactly like one that exists nowhere (issue 12, items 2-5)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.config import Config
from gateway.errors import error_body
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.mcp import mcp_call as post
from tests.support.mcp import mcp_post, result_of
from tests.support.procs import BackendProcess

ids = itertools.count(70_000)

ABOUT = ["reports://about", "reports://logo.png"]
REPORT_TEMPLATE = "reports://{tenant}/reports/{id}"
FILES_TEMPLATE = "reports://{tenant}/files/{path*}"

# report_embedded is acme's; the other three prompts are everyone's. Each tenant sees its own
# summary resource; the templates are everyone's but the search one, which no route names.
ROUTES: list[dict[str, Any]] = [
    {"prompts": ["report_embedded"], "backend": "reports", "tenants": ["acme"]},
    {"prompts": ["report_greeting", "report_summarize", "report_chart"], "backend": "reports"},
    {"prompts": ["report_absent_*"], "backend": "reports"},  # a glob no backend prompt matches
    {"resources": ["reports://acme/*"], "backend": "reports", "tenants": ["acme"]},
    {"resources": ["reports://globex/*"], "backend": "reports", "tenants": ["globex"]},
    {
        "resources": ABOUT,
        "resource_templates": [REPORT_TEMPLATE, FILES_TEMPLATE],
        "backend": "reports",
    },
    {"tools": ["echo"], "backend": "reports"},
]

# What each tenant is routed, in taskgate's order (route in YAML order, then name or URI).
VISIBLE_PROMPTS = {
    "acme": ["report_embedded", "report_chart", "report_greeting", "report_summarize"],
    "globex": ["report_chart", "report_greeting", "report_summarize"],
}
VISIBLE_RESOURCES = {
    "acme": ["reports://acme/summary", *ABOUT],
    "globex": ["reports://globex/summary", *ABOUT],
}
VISIBLE_TEMPLATES = [FILES_TEMPLATE, REPORT_TEMPLATE]

LISTS = {  # method -> (result field, item key, what each tenant sees)
    "prompts/list": ("prompts", "name", VISIBLE_PROMPTS),
    "resources/list": ("resources", "uri", VISIBLE_RESOURCES),
    "resources/templates/list": (
        "resourceTemplates",
        "uriTemplate",
        {"acme": VISIBLE_TEMPLATES, "globex": VISIBLE_TEMPLATES},
    ),
}


def config(
    issuer: Issuer, backends: list[BackendProcess], routes: list[Any], **discovery: Any
) -> Config:
    return gateway_config(
        {"reports": [b.url for b in backends]},
        routes,
        auth=jwt_auth(issuer),
        discovery={"refresh_s": 30, **discovery},
    )


@pytest.fixture
async def gateway(
    issuer: Issuer, report_backends: list[BackendProcess]
) -> AsyncIterator[RunningGateway]:
    """taskgate in front of r1 and r2 with ROUTES, its lists paged two items a page."""
    async with serving(config(issuer, report_backends, ROUTES, page_size=2)) as running:
        yield running


async def whole_list(
    http: aiohttp.ClientSession, url: str, method: str, token: str
) -> tuple[list[dict[str, Any]], int]:
    """Every item of every page of a list through taskgate, and the number of pages."""
    field = LISTS[method][0]
    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {}
    for pages in itertools.count(1):
        answer = await post(http, url, method, params, token=token)
        assert answer.status == 200, answer.raw
        result = result_of(answer.message)
        assert (result["ttlMs"], result["cacheScope"]) == (30_000, "private")
        assert len(result[field]) <= 2
        items.extend(result[field])
        if "nextCursor" not in result:
            return items, pages
        params = {"cursor": result["nextCursor"]}
    raise AssertionError("unreachable")


# --- lists -------------------------------------------------------------------------------


@pytest.mark.parametrize("tenant", ["acme", "globex"])
@pytest.mark.parametrize("method", list(LISTS))
async def test_a_list_is_the_routed_subset_of_the_direct_one_each_item_once_across_pages(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    r1: BackendProcess,
    method: str,
    tenant: str,
) -> None:
    field, key, visible = LISTS[method]
    status, direct = await mcp_post(http, r1.url, method, {}, id=next(ids))
    assert status == 200
    by_key = {item[key]: item for item in result_of(direct)[field]}

    items, pages = await whole_list(http, gateway.url, method, issuer.token(tenant, "ann"))

    assert [item[key] for item in items] == visible[tenant]  # each once, in taskgate's order
    assert pages == (len(visible[tenant]) + 1) // 2
    for item in items:  # the backend's objects, unchanged
        assert item == by_key[item[key]]
        assert orjson.dumps(item) == orjson.dumps(by_key[item[key]])


@pytest.mark.parametrize("method", list(LISTS))
@pytest.mark.parametrize("cursor", ["bogus", "", 7, {"after": 1}])
async def test_a_cursor_taskgate_did_not_issue_is_invalid_params_at_200(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway, method: str, cursor: Any
) -> None:
    token = issuer.token("acme", "ann")
    answer = await post(http, gateway.url, method, {"cursor": cursor}, token=token, id=4242)
    assert answer.status == 200
    error = answer.message["error"]
    assert answer.message["id"] == 4242
    assert error["code"] == -32602
    assert "cursor" in error["message"]


async def test_another_lists_cursor_is_refused(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway
) -> None:
    token = issuer.token("acme", "ann")
    first = await post(http, gateway.url, "prompts/list", token=token)
    cursor = result_of(first.message)["nextCursor"]
    answer = await post(http, gateway.url, "resources/list", {"cursor": cursor}, token=token)
    assert (answer.status, answer.message["error"]["code"]) == (200, -32602)


# --- prompts/get -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("report_greeting", None),
        ("report_summarize", {"tenant": "acme", "period": "week", "report_id": "r1-2"}),
        ("report_summarize", {"tenant": "globex"}),
        ("report_embedded", {"tenant": "acme"}),
        ("report_chart", None),
        ("report_summarize", {}),  # the backend's own error (-32603 at 200), relayed
    ],
)
async def test_prompts_get_is_the_backends_answer_byte_for_byte(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    report_backends: list[BackendProcess],
    name: str,
    arguments: dict[str, str] | None,
) -> None:
    params: dict[str, Any] = {"name": name}
    if arguments is not None:
        params["arguments"] = arguments
    request_id = next(ids)
    direct = {
        b.name: await post(http, b.url, "prompts/get", params, id=request_id)
        for b in report_backends
    }
    token = issuer.token("acme", "ann")
    served = set()
    for _ in range(4):  # the replicas take turns
        answer = await post(http, gateway.url, "prompts/get", params, token=token, id=request_id)
        replica = next(r for r, d in direct.items() if d.raw == answer.raw)
        assert answer.status == direct[replica].status
        assert answer.headers["Content-Type"] == direct[replica].headers["Content-Type"]
        served.add(replica)
    if len({d.raw for d in direct.values()}) == len(direct):  # answers that name the replica
        assert served == set(direct)


async def test_a_tenant_hidden_prompt_answers_exactly_like_one_that_exists_nowhere(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway
) -> None:
    token = issuer.token("globex", "gina")
    names = {
        "hidden": "report_embedded",  # acme's only
        "unrouted": "report_nowhere",  # no route names it
        "unlisted": "report_absent_1",  # routed by a glob; the backend has no such prompt
    }
    answers = {
        why: await post(http, gateway.url, "prompts/get", {"name": n}, token=token, id=99)
        for why, n in names.items()
    }
    for why, answer in answers.items():
        assert answer.status == 200
        assert answer.raw == error_body(99, -32602, f"Unknown prompt: {names[why]}")
        assert answer.headers["Content-Type"] == "application/json"
        assert set(answer.headers) == set(answers["unrouted"].headers)
    # acme sees report_embedded; the same request is served for it
    served = await post(
        http,
        gateway.url,
        "prompts/get",
        {"name": "report_embedded", "arguments": {"tenant": "acme"}},
        token=issuer.token("acme", "ann"),
    )
    assert result_of(served.message)["messages"][0]["content"]["type"] == "resource"


async def test_a_prompt_whose_route_needs_a_scope_is_403_without_it(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    routes = [{"prompts": ["report_greeting"], "backend": "reports", "scopes": ["reports"]}]
    async with serving(config(issuer, report_backends, routes)) as running:
        params = {"name": "report_greeting"}
        refused = await post(http, running.url, "prompts/get", params, token=issuer.token())
        assert refused.status == 403
        assert refused.message["error"]["code"] == -32600
        assert "insufficient_scope" in refused.headers["WWW-Authenticate"]
        assert "prompt" in refused.message["error"]["message"]
        token = issuer.token(scopes=("reports",))
        allowed = await post(http, running.url, "prompts/get", params, token=token)
        assert allowed.status == 200
        assert result_of(allowed.message)["resultType"] == "complete"


async def test_prompts_get_without_mcp_name_is_400_header_mismatch(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway
) -> None:
    answer = await post(
        http,
        gateway.url,
        "prompts/get",
        {"name": "report_greeting"},
        token=issuer.token(),
        id=5,
        drop=("Mcp-Name",),
    )
    assert answer.status == 400
    assert (answer.message["id"], answer.message["error"]["code"]) == (5, -32020)


async def test_prompts_get_without_a_name_is_invalid_params(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway
) -> None:
    answer = await post(http, gateway.url, "prompts/get", {}, token=issuer.token(), id=6)
    assert answer.status == 200
    assert (answer.message["id"], answer.message["error"]["code"]) == (6, -32602)


async def test_a_method_taskgate_does_not_serve_is_method_not_found(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway
) -> None:
    answer = await post(http, gateway.url, "resources/subscribe", {}, token=issuer.token())
    assert (answer.status, answer.message["error"]["code"]) == (404, -32601)


# --- discover ----------------------------------------------------------------------------


async def discover(http: aiohttp.ClientSession, url: str, token: str) -> dict[str, Any]:
    answer = await post(http, url, "server/discover", token=token)
    assert answer.status == 200
    capabilities: dict[str, Any] = result_of(answer.message)["capabilities"]
    return capabilities


async def test_discover_advertises_prompts_resources_and_completions_when_routed(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway
) -> None:
    capabilities = await discover(http, gateway.url, issuer.token())
    assert capabilities["prompts"] == {"listChanged": True}
    assert capabilities["tools"] == {"listChanged": True}
    # resources/read and completion/complete are routed end to end; no subscriptions
    assert capabilities["resources"] == {"listChanged": True}
    assert capabilities["completions"] == {}


async def test_discover_advertises_no_prompts_when_no_route_names_one(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    routes = [{"tools": ["echo"], "backend": "reports"}]
    async with serving(config(issuer, report_backends, routes)) as running:
        capabilities = await discover(http, running.url, issuer.token())
        assert set(capabilities) <= {"tools", "extensions"}
        # and what that capability gates is Method not found, as the core's schema says of a
        # method behind a capability the server did not advertise
        token = issuer.token()
        calls: list[tuple[str, dict[str, Any]]] = [
            ("prompts/list", {}),
            ("prompts/get", {"name": "report_greeting"}),
            ("resources/list", {}),
            ("resources/templates/list", {}),
            ("resources/read", {"uri": "reports://about"}),
            ("completion/complete", {"ref": {"type": "ref/prompt", "name": "x"}}),
        ]
        for method, params in calls:
            answer = await post(http, running.url, method, params, token=token, id=3)
            assert (answer.status, answer.message["error"]["code"]) == (404, -32601), method
            assert answer.message["id"] == 3


@pytest.mark.parametrize("cursor", ["bogus", "", 0])
async def test_tools_list_is_one_page_so_any_cursor_is_invalid_params(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway, cursor: Any
) -> None:
    token = issuer.token()
    answer = await post(http, gateway.url, "tools/list", {"cursor": cursor}, token=token, id=5)
    assert answer.status == 200
    assert (answer.message["id"], answer.message["error"]["code"]) == (5, -32602)
    whole = await post(http, gateway.url, "tools/list", {"cursor": None}, token=token)
    assert "tools" in result_of(whole.message)
