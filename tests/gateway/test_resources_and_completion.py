"""resources/read and completion/complete through taskgate, against the two report replicas,
for two tenants with JWT: a routed resource (exact, glob or template-expanded) and a routed
completion ref are the backend's answer as it sent it; a URI or ref hidden from a tenant, or
not served by its backend, answers exactly like one that exists nowhere, and so does the
backend's own not-found (issue 12, items 3-5)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gateway.config import Config
from gateway.errors import error_body
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.mcp import Answer, result_of
from tests.support.mcp import mcp_call as post
from tests.support.procs import BackendProcess

ids = itertools.count(80_000)

ABOUT = ["reports://about", "reports://logo.png"]
REPORT_TEMPLATE = "reports://{tenant}/reports/{id}"
FILES_TEMPLATE = "reports://{tenant}/files/{path*}"
SEARCH_TEMPLATE = "reports://{tenant}/search{?q,limit}"
UNLISTED_TEMPLATE = "reports://{tenant}/nothing/{x}"  # routed; the backend has no such template

ROUTES: list[dict[str, Any]] = [
    {"prompts": ["report_embedded"], "backend": "reports", "tenants": ["acme"]},
    {"prompts": ["report_greeting", "report_summarize"], "backend": "reports"},
    {"resources": ["reports://acme/*"], "backend": "reports", "tenants": ["acme"]},
    {"resources": ["reports://globex/*"], "backend": "reports", "tenants": ["globex"]},
    {"resources": ["reports://absent/*"], "backend": "reports"},  # a glob nothing listed matches
    {
        "resources": ABOUT,
        "resource_templates": [REPORT_TEMPLATE, FILES_TEMPLATE, UNLISTED_TEMPLATE],
        "backend": "reports",
    },
    {"resource_templates": [SEARCH_TEMPLATE], "backend": "reports", "tenants": ["acme"]},
    {"tools": ["echo"], "backend": "reports"},
]


def config(issuer: Issuer, backends: list[BackendProcess], routes: list[Any]) -> Config:
    return gateway_config(
        {"reports": [b.url for b in backends]},
        routes,
        auth=jwt_auth(issuer),
        discovery={"refresh_s": 30},
    )


@pytest.fixture
async def gateway(
    issuer: Issuer, report_backends: list[BackendProcess]
) -> AsyncIterator[RunningGateway]:
    async with serving(config(issuer, report_backends, ROUTES)) as running:
        yield running


async def assert_relayed(
    http: aiohttp.ClientSession,
    gateway: RunningGateway,
    backends: list[BackendProcess],
    method: str,
    params: dict[str, Any],
    token: str,
) -> Answer:
    """The answer through taskgate is one replica's direct answer, byte for byte, and the
    replicas take turns when their answers differ."""
    request_id = next(ids)
    direct = {b.name: await post(http, b.url, method, params, id=request_id) for b in backends}
    served = set()
    answer: Answer | None = None
    for _ in range(4):
        answer = await post(http, gateway.url, method, params, token=token, id=request_id)
        replica = next((r for r, d in direct.items() if d.raw == answer.raw), None)
        assert replica is not None, answer.raw
        assert answer.status == direct[replica].status == 200
        assert answer.headers["Content-Type"] == direct[replica].headers["Content-Type"]
        served.add(replica)
    if len({d.raw for d in direct.values()}) == len(direct):
        assert served == set(direct)
    assert answer is not None
    return answer


def not_found(request_id: int, uri: str) -> bytes:
    return error_body(request_id, -32602, "Resource not found", {"uri": uri})


# --- resources/read ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri",
    [
        "reports://about",  # text, names the replica
        "reports://logo.png",  # blob
        "reports://acme/summary",  # the tenant's own, by glob
        "reports://acme/reports/42",  # a template under the tenant's glob: the template routes
        "reports://globex/reports/a%20b",  # {var}, percent-encoded, as sent
        "reports://acme/files/q1/sales.csv",  # {path*}
        "reports://acme/search?q=late&limit=3",  # {?q,limit}
        "reports://acme/search",  # the query left out
    ],
)
async def test_reading_a_routed_resource_is_the_backends_answer_byte_for_byte(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    report_backends: list[BackendProcess],
    uri: str,
) -> None:
    token = issuer.token("acme", "ann")
    answer = await assert_relayed(
        http, gateway, report_backends, "resources/read", {"uri": uri}, token
    )
    assert result_of(answer.message)["contents"][0]["uri"] == uri


async def test_each_tenant_reads_its_own_summary(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    report_backends: list[BackendProcess],
) -> None:
    token = issuer.token("globex", "gina")
    params = {"uri": "reports://globex/summary"}
    await assert_relayed(http, gateway, report_backends, "resources/read", params, token)


HIDDEN_URIS = {
    "unrouted": "reports://nowhere",  # no route names it
    "hidden": "reports://acme/summary",  # listed, but acme's glob only
    "unlisted": "reports://absent/x",  # routed by a glob; the backend has no such resource
    "template-of-another-tenant": "reports://globex/search?q=x",  # acme's template only
    "unlisted-template": "reports://acme/nothing/1",  # routed template the backend lacks
    "traversal": "reports://globex/files/../summary",  # no template match with a dot segment
    "no-query-here": "reports://globex/reports/1?x=1",  # the template has no query
    "backend-refuses": "reports://globex/files/%2F",  # matched; the backend's own not-found
}


async def test_a_hidden_or_unserved_uri_answers_exactly_like_one_that_exists_nowhere(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway
) -> None:
    token = issuer.token("globex", "gina")
    answers = {
        why: await post(http, gateway.url, "resources/read", {"uri": u}, token=token, id=99)
        for why, u in HIDDEN_URIS.items()
    }
    for why, answer in answers.items():
        assert answer.status == 200, why
        assert answer.raw == not_found(99, HIDDEN_URIS[why]), why
        assert answer.headers["Content-Type"] == "application/json"
        assert set(answer.headers) == set(answers["unrouted"].headers), why


async def test_the_backends_own_not_found_is_normalised(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway, r1: BackendProcess
) -> None:
    uri = "reports://acme/files/%2F"  # {path*} matches it; FastMCP does not serve it
    direct = await post(http, r1.url, "resources/read", {"uri": uri}, id=7)
    assert direct.status == 400
    assert direct.message["error"]["data"] == {"uri": uri}
    token = issuer.token("acme", "ann")
    answer = await post(http, gateway.url, "resources/read", {"uri": uri}, token=token, id=7)
    assert (answer.status, answer.raw) == (200, not_found(7, uri))


async def test_a_backend_error_that_is_not_a_not_found_is_relayed(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    report_backends: list[BackendProcess],
) -> None:
    params = {"uri": "reports://acme/search?limit=abc"}  # -32603 at 200 from FastMCP
    request_id = next(ids)
    direct = {
        b.name: await post(http, b.url, "resources/read", params, id=request_id)
        for b in report_backends
    }
    token = issuer.token("acme", "ann")
    answer = await post(http, gateway.url, "resources/read", params, token=token, id=request_id)
    assert answer.raw in {d.raw for d in direct.values()}
    assert answer.message["error"]["code"] == -32603


async def test_resources_read_without_mcp_name_is_400_and_without_a_uri_invalid_params(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway
) -> None:
    token = issuer.token()
    params = {"uri": "reports://about"}
    answer = await post(
        http, gateway.url, "resources/read", params, token=token, id=5, drop=("Mcp-Name",)
    )
    assert (answer.status, answer.message["error"]["code"]) == (400, -32020)
    answer = await post(http, gateway.url, "resources/read", {}, token=token, id=6)
    assert (answer.status, answer.message["error"]["code"]) == (200, -32602)
    assert answer.message["error"]["message"] == "Invalid params: params.uri must be a string"


async def test_a_resource_whose_route_needs_a_scope_is_403_without_it(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    routes = [{"resource_templates": [REPORT_TEMPLATE], "backend": "reports", "scopes": ["r"]}]
    async with serving(config(issuer, report_backends, routes)) as running:
        params = {"uri": "reports://acme/reports/1"}
        refused = await post(http, running.url, "resources/read", params, token=issuer.token())
        assert refused.status == 403
        assert "insufficient_scope" in refused.headers["WWW-Authenticate"]
        allowed = await post(
            http, running.url, "resources/read", params, token=issuer.token(scopes=("r",))
        )
        assert allowed.status == 200
        assert result_of(allowed.message)["contents"][0]["uri"] == params["uri"]


# --- completion/complete -----------------------------------------------------------------


def completion(ref: dict[str, Any], name: str, value: str, **context: str) -> dict[str, Any]:
    params: dict[str, Any] = {"ref": ref, "argument": {"name": name, "value": value}}
    if context:
        params["context"] = {"arguments": context}
    return params


@pytest.mark.parametrize(
    "params",
    [
        completion({"type": "ref/prompt", "name": "report_summarize"}, "tenant", "a"),
        completion({"type": "ref/prompt", "name": "report_summarize"}, "report_id", ""),
        completion({"type": "ref/resource", "uri": REPORT_TEMPLATE}, "tenant", "g"),
        completion({"type": "ref/resource", "uri": REPORT_TEMPLATE}, "id", "", tenant="acme"),
        completion({"type": "ref/prompt", "name": "report_embedded"}, "tenant", ""),  # acme's
    ],
)
async def test_completion_of_a_routed_ref_is_the_backends_answer_byte_for_byte(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    report_backends: list[BackendProcess],
    params: dict[str, Any],
) -> None:
    token = issuer.token("acme", "ann")
    answer = await assert_relayed(
        http, gateway, report_backends, "completion/complete", params, token
    )
    assert "values" in result_of(answer.message)["completion"]


async def test_completion_goes_upstream_without_an_mcp_name(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway
) -> None:
    params = completion({"type": "ref/prompt", "name": "report_summarize"}, "tenant", "a")
    answer = await post(http, gateway.url, "completion/complete", params, token=issuer.token())
    assert answer.status == 200
    assert result_of(answer.message)["completion"]["values"] == ["acme"]


@pytest.mark.parametrize(
    ("ref", "nowhere"),
    [
        (
            {"type": "ref/prompt", "name": "report_embedded"},  # acme's only
            {"type": "ref/prompt", "name": "report_nowhere"},
        ),
        (
            {"type": "ref/resource", "uri": SEARCH_TEMPLATE},  # acme's only
            {"type": "ref/resource", "uri": "reports://{tenant}/nowhere/{x}"},
        ),
        (
            {"type": "ref/resource", "uri": UNLISTED_TEMPLATE},  # routed; the backend lacks it
            {"type": "ref/resource", "uri": "reports://{tenant}/nowhere/{x}"},
        ),
        (
            {"type": "ref/resource", "uri": "reports://globex/summary"},  # a URI, not a template
            {"type": "ref/resource", "uri": "reports://{tenant}/nowhere/{x}"},
        ),
    ],
)
async def test_a_hidden_ref_answers_exactly_like_one_that_exists_nowhere(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    ref: dict[str, Any],
    nowhere: dict[str, Any],
) -> None:
    token = issuer.token("globex", "gina")
    hidden = await post(
        http, gateway.url, "completion/complete", completion(ref, "x", ""), token=token, id=3
    )
    absent = await post(
        http, gateway.url, "completion/complete", completion(nowhere, "x", ""), token=token, id=3
    )
    if ref["type"] == "ref/prompt":
        assert hidden.raw == error_body(3, -32602, f"Unknown prompt: {ref['name']}")
        assert absent.raw == error_body(3, -32602, f"Unknown prompt: {nowhere['name']}")
        # the same answer prompts/get gives
        get = await post(http, gateway.url, "prompts/get", {"name": ref["name"]}, token=token, id=3)
        assert get.raw == hidden.raw
    else:
        assert hidden.raw == not_found(3, ref["uri"])
        assert absent.raw == not_found(3, nowhere["uri"])
    assert hidden.status == absent.status == 200
    assert set(hidden.headers) == set(absent.headers)


@pytest.mark.parametrize(
    "ref",
    [
        None,
        "report_summarize",
        {},
        {"type": "ref/prompt"},
        {"type": "ref/resource", "uri": 3},
        {"type": "ref/tool", "name": "echo"},
    ],
)
async def test_a_malformed_ref_is_invalid_params(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway, ref: Any
) -> None:
    params: dict[str, Any] = {"argument": {"name": "x", "value": ""}}
    if ref is not None:
        params["ref"] = ref
    answer = await post(
        http, gateway.url, "completion/complete", params, token=issuer.token(), id=4
    )
    assert answer.status == 200
    assert answer.raw == error_body(
        4, -32602, "Invalid params: params.ref must be a prompt or resource reference"
    )


# --- discover ----------------------------------------------------------------------------


async def test_discover_advertises_resources_and_completions(
    http: aiohttp.ClientSession, issuer: Issuer, gateway: RunningGateway
) -> None:
    answer = await post(http, gateway.url, "server/discover", token=issuer.token())
    capabilities = result_of(answer.message)["capabilities"]
    assert capabilities["resources"] == {"listChanged": True}
    assert capabilities["completions"] == {}
    assert capabilities["prompts"] == {"listChanged": True}


async def test_discover_advertises_neither_without_routes_for_them(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    routes = [{"tools": ["echo"], "backend": "reports"}]
    async with serving(config(issuer, report_backends, routes)) as running:
        answer = await post(http, running.url, "server/discover", token=issuer.token())
        capabilities = result_of(answer.message)["capabilities"]
        assert "resources" not in capabilities
        assert "completions" not in capabilities


# --- `*` and globs: every resource, every template, or some by glob (issue 24, item 2) ----

EVERYTHING: list[dict[str, Any]] = [
    {"resources": ["*"], "resource_templates": ["*"], "backend": "reports", "tenants": ["acme"]},
    {"resources": ["reports://about"], "backend": "reports"},
]


async def listed(
    http: aiohttp.ClientSession, url: str, method: str, field: str, key: str, token: str = ""
) -> list[str]:
    answer = await post(http, url, method, {}, token=token or None)
    assert answer.status == 200, answer.raw
    result = result_of(answer.message)
    assert "nextCursor" not in result
    return sorted(item[key] for item in result[field])


async def test_star_routes_list_every_resource_and_template_the_backend_lists(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    r1: BackendProcess,
) -> None:
    acme, globex = issuer.token("acme", "ann"), issuer.token("globex", "gina")
    lists = [
        ("resources/list", "resources", "uri"),
        ("resources/templates/list", "resourceTemplates", "uriTemplate"),
    ]
    async with serving(config(issuer, report_backends, EVERYTHING)) as running:
        for method, field, key in lists:
            direct = await listed(http, r1.url, method, field, key)
            assert direct  # the backend has some of each
            assert await listed(http, running.url, method, field, key, acme) == direct
        # the other tenant sees what the shared route names, and no template
        assert await listed(http, running.url, *lists[0], globex) == ["reports://about"]
        assert await listed(http, running.url, *lists[1], globex) == []


@pytest.mark.parametrize(
    "uri",
    [
        "reports://about",
        "reports://logo.png",
        "reports://globex/summary",  # any listed URI: `*` keeps nothing to a prefix
        "reports://acme/reports/42",  # every template the backend lists: {var}
        "reports://globex/files/q1/sales.csv",  # {path*}
        "reports://acme/search?q=late&limit=3",  # {?q,limit}
    ],
)
async def test_star_routes_read_every_listed_uri_and_every_templates_uri(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    uri: str,
) -> None:
    async with serving(config(issuer, report_backends, EVERYTHING)) as running:
        token = issuer.token("acme", "ann")
        answer = await assert_relayed(
            http, running, report_backends, "resources/read", {"uri": uri}, token
        )
        assert result_of(answer.message)["contents"][0]["uri"] == uri
        # completion reaches a listed template through `*` as well
        params = completion({"type": "ref/resource", "uri": REPORT_TEMPLATE}, "tenant", "g")
        answer = await post(http, running.url, "completion/complete", params, token=token)
        assert result_of(answer.message)["completion"]["values"] == ["globex"]


async def test_under_star_routes_a_uri_the_backend_neither_lists_nor_templates_is_not_found(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    unserved = [
        "reports://nowhere",  # `*` matches it; the backend does not list it
        "other://x",
        "reports://globex/files/../summary",  # listed only without the dot segment
        "reports://acme/reports/1?x=1",  # no template has this query
        "reports://acme/files/%2F",  # a template matches; the backend's own not-found
    ]
    async with serving(config(issuer, report_backends, EVERYTHING)) as running:
        acme, globex = issuer.token("acme", "ann"), issuer.token("globex", "gina")
        for uri in unserved:
            answer = await post(
                http, running.url, "resources/read", {"uri": uri}, token=acme, id=51
            )
            assert (answer.status, answer.raw) == (200, not_found(51, uri)), uri
        # for a tenant the `*` route is hidden from, what it exposes exists nowhere
        for uri in ["reports://globex/summary", "reports://acme/reports/42"]:
            answer = await post(
                http, running.url, "resources/read", {"uri": uri}, token=globex, id=52
            )
            assert (answer.status, answer.raw) == (200, not_found(52, uri)), uri


async def test_a_template_glob_exposes_the_templates_it_matches_and_reads_only_through_them(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
) -> None:
    routes = [
        {
            "resource_templates": ["reports://{tenant}/reports/*", "reports://{tenant}/s*"],
            "backend": "reports",
        }
    ]
    token = issuer.token("acme", "ann")
    async with serving(config(issuer, report_backends, routes)) as running:
        found = await listed(
            http, running.url, "resources/templates/list", "resourceTemplates", "uriTemplate", token
        )
        assert found == sorted([REPORT_TEMPLATE, SEARCH_TEMPLATE])
        for uri in ["reports://acme/reports/7", "reports://globex/search?q=x"]:
            await assert_relayed(
                http, running, report_backends, "resources/read", {"uri": uri}, token
            )
        uri = "reports://acme/files/q1/sales.csv"  # FILES_TEMPLATE: listed, but no glob has it
        answer = await post(http, running.url, "resources/read", {"uri": uri}, token=token, id=53)
        assert (answer.status, answer.raw) == (200, not_found(53, uri))
        assert await listed(http, running.url, "resources/list", "resources", "uri", token) == []
