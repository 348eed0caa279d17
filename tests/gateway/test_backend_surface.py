"""The report backend's prompts, resources, templates and completions on the wire, talked to
directly: the FastMCP 4.1.4 facts a gateway relaying that surface relies on."""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from backends.report import PNG_BYTES
from tests.support.mcp import JsonObject, build_request, mcp_post, post_raw, result_of
from tests.support.procs import BackendProcess

ids = itertools.count(1)

PROMPTS = {"report_greeting", "report_summarize", "report_embedded", "report_chart"}
RESOURCES = {
    "reports://about": "text/plain",
    "reports://logo.png": "image/png",
    "reports://acme/summary": "application/json",
    "reports://globex/summary": "application/json",
}
TEMPLATES = {
    "reports://{tenant}/reports/{id}",
    "reports://{tenant}/files/{path*}",
    "reports://{tenant}/search{?q,limit}",
}
REPORT_TEMPLATE = "reports://{tenant}/reports/{id}"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# The paged backend: `--many` numbered items on top of the fixed ones, `--page-size` a page.
MANY = 25
PAGE_SIZE = 10


@pytest.fixture(scope="module")
def paged() -> Iterator[BackendProcess]:
    """A replica with MANY extra prompts, resources and templates, listed PAGE_SIZE a page."""
    extra = ("--many", str(MANY), "--page-size", str(PAGE_SIZE))
    with BackendProcess("p1", extra_args=extra) as backend:
        yield backend


async def request(
    http: aiohttp.ClientSession, url: str, method: str, params: JsonObject | None = None
) -> tuple[int, JsonObject]:
    """One request with the MCP headers (Mcp-Name derived from the body)."""
    return await mcp_post(http, url, method, params or {}, id=next(ids))


async def result(
    http: aiohttp.ClientSession, url: str, method: str, params: JsonObject | None = None
) -> JsonObject:
    """The result of one request that must succeed with HTTP 200."""
    status, response = await request(http, url, method, params)
    assert status == 200, response
    return result_of(response)


async def error(
    http: aiohttp.ClientSession, url: str, method: str, params: JsonObject | None = None
) -> tuple[int, JsonObject]:
    """The HTTP status and the JSON-RPC error of a request that must fail."""
    status, response = await request(http, url, method, params)
    assert "error" in response, response
    assert set(response) == {"jsonrpc", "id", "error"}, response
    error: JsonObject = response["error"]
    return status, error


async def get_prompt(
    http: aiohttp.ClientSession, url: str, name: str, arguments: dict[str, str] | None = None
) -> JsonObject:
    params: JsonObject = {"name": name}
    if arguments is not None:
        params["arguments"] = arguments
    return await result(http, url, "prompts/get", params)


async def read(http: aiohttp.ClientSession, url: str, uri: str) -> JsonObject:
    """resources/read; the one content item, whose URI must be the one asked for."""
    answer = await result(http, url, "resources/read", {"uri": uri})
    (content,) = answer["contents"]
    assert content["uri"] == uri
    item: JsonObject = content
    return item


async def complete(
    http: aiohttp.ClientSession,
    url: str,
    ref: JsonObject,
    name: str,
    value: str,
    context: dict[str, str] | None = None,
) -> JsonObject:
    params: JsonObject = {"ref": ref, "argument": {"name": name, "value": value}}
    if context is not None:
        params["context"] = {"arguments": context}
    answer = await result(http, url, "completion/complete", params)
    # Not a cacheable method: no hints.
    assert "ttlMs" not in answer
    assert "cacheScope" not in answer
    completion: JsonObject = answer["completion"]
    return completion


def texts(prompt: JsonObject) -> list[str]:
    return [m["content"]["text"] for m in prompt["messages"] if m["content"]["type"] == "text"]


def assert_uncached_hints(answer: JsonObject) -> None:
    """FastMCP without cache_ttl: every cacheable result says ttlMs 0, private."""
    assert (answer["ttlMs"], answer["cacheScope"]) == (0, "private")


# --- discover ----------------------------------------------------------------------------


async def test_discover_advertises_prompts_resources_and_completions(
    http: aiohttp.ClientSession, r1: BackendProcess
) -> None:
    answer = await result(http, r1.url, "server/discover")
    capabilities = answer["capabilities"]
    assert capabilities["prompts"] == {"listChanged": False}
    assert capabilities["resources"] == {"subscribe": False, "listChanged": False}
    # Declared only because the backend registers a completion handler (@mcp.completion);
    # a FastMCP server without one omits it and answers completion/complete 404 -32601.
    assert capabilities["completions"] == {}
    assert_uncached_hints(answer)


# --- prompts -----------------------------------------------------------------------------


async def test_prompts_list_is_one_page_with_hints(
    http: aiohttp.ClientSession, r1: BackendProcess
) -> None:
    answer = await result(http, r1.url, "prompts/list")
    prompts = {prompt["name"]: prompt for prompt in answer["prompts"]}
    assert set(prompts) == PROMPTS
    assert "nextCursor" not in answer  # FastMCP pages nothing unless list_page_size is set
    assert_uncached_hints(answer)
    arguments = {a["name"]: a["required"] for a in prompts["report_summarize"]["arguments"]}
    assert arguments == {"tenant": True, "period": False, "report_id": False}
    assert prompts["report_greeting"]["arguments"] == []


async def test_an_unpaged_list_ignores_any_cursor(
    http: aiohttp.ClientSession, r1: BackendProcess
) -> None:
    whole = await result(http, r1.url, "prompts/list")
    for cursor in ("bogus", ""):
        again = await result(http, r1.url, "prompts/list", {"cursor": cursor})
        assert again["prompts"] == whole["prompts"]
        assert "nextCursor" not in again


@pytest.mark.parametrize("index", [0, 1])
async def test_a_prompt_without_arguments_names_the_replica(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess], index: int
) -> None:
    backend = report_backends[index]
    answer = await get_prompt(http, backend.url, "report_greeting")
    assert texts(answer) == [f"Hello from the report backend, replica {backend.name}."]
    assert [m["role"] for m in answer["messages"]] == ["user"]
    assert answer["resultType"] == "complete"
    # prompts/get is not a cacheable method: no hints.
    assert "ttlMs" not in answer
    assert "cacheScope" not in answer


async def test_a_prompt_with_required_and_optional_arguments(
    http: aiohttp.ClientSession, r1: BackendProcess
) -> None:
    given = {"tenant": "acme", "period": "week", "report_id": "r1-2"}
    answer = await get_prompt(http, r1.url, "report_summarize", given)
    assert texts(answer) == ["Summarize acme's report r1-2 for the last week (replica r1)."]

    defaults = await get_prompt(http, r1.url, "report_summarize", {"tenant": "globex"})
    assert texts(defaults) == ["Summarize globex's reports for the last month (replica r1)."]


async def test_a_prompt_missing_a_required_argument_is_an_internal_error_at_200(
    http: aiohttp.ClientSession, r1: BackendProcess
) -> None:
    """FastMCP reports a missing argument as -32603 (not -32602), and the SDK sends it with
    HTTP 200: only -32602 and the header errors travel as 400."""
    status, err = await error(http, r1.url, "prompts/get", {"name": "report_summarize"})
    assert (status, err["code"]) == (200, -32603)
    assert "Missing required arguments" in err["message"]


async def test_a_prompt_embeds_the_resource_it_names(
    http: aiohttp.ClientSession, r1: BackendProcess
) -> None:
    answer = await get_prompt(http, r1.url, "report_embedded", {"tenant": "globex"})
    embedded, comment = (m["content"] for m in answer["messages"])
    assert embedded["type"] == "resource"
    assert comment == {"type": "text", "text": "Comment on this summary (replica r1)."}
    # The embedded contents are what resources/read of that URI answers, byte for byte.
    assert embedded["resource"] == await read(http, r1.url, "reports://globex/summary")


async def test_a_prompt_returns_an_image(http: aiohttp.ClientSession, r1: BackendProcess) -> None:
    answer = await get_prompt(http, r1.url, "report_chart")
    image, caption = (m["content"] for m in answer["messages"])
    assert (image["type"], image["mimeType"]) == ("image", "image/png")
    assert base64.b64decode(image["data"]) == PNG_BYTES
    assert PNG_BYTES.startswith(PNG_SIGNATURE)
    assert caption["text"] == "Describe this chart (replica r1)."


async def test_an_unknown_prompt_is_400_invalid_params(
    http: aiohttp.ClientSession, r1: BackendProcess
) -> None:
    status, err = await error(http, r1.url, "prompts/get", {"name": "no_such_prompt"})
    assert status == 400
    assert err == {"code": -32602, "message": "Unknown prompt: 'no_such_prompt'"}  # no data


# --- resources ---------------------------------------------------------------------------


async def test_resources_list_is_one_page_with_hints(
    http: aiohttp.ClientSession, r1: BackendProcess
) -> None:
    answer = await result(http, r1.url, "resources/list")
    assert {r["uri"]: r["mimeType"] for r in answer["resources"]} == RESOURCES
    assert "nextCursor" not in answer
    assert_uncached_hints(answer)


@pytest.mark.parametrize("index", [0, 1])
async def test_a_text_resource_names_the_replica(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess], index: int
) -> None:
    backend = report_backends[index]
    answer = await result(http, backend.url, "resources/read", {"uri": "reports://about"})
    assert_uncached_hints(answer)  # resources/read is cacheable: it carries hints
    assert answer["contents"] == [
        {
            "uri": "reports://about",
            "mimeType": "text/plain",
            "text": f"The report backend, replica {backend.name}.",
        }
    ]


async def test_a_blob_resource(http: aiohttp.ClientSession, r1: BackendProcess) -> None:
    content = await read(http, r1.url, "reports://logo.png")
    assert "text" not in content
    assert content["mimeType"] == "image/png"
    assert base64.b64decode(content["blob"]) == PNG_BYTES
    assert content["_meta"] == {"replica": "r1"}


@pytest.mark.parametrize("tenant", ["acme", "globex"])
async def test_each_tenant_has_a_summary_under_its_own_uri_prefix(
    http: aiohttp.ClientSession, r1: BackendProcess, tenant: str
) -> None:
    content = await read(http, r1.url, f"reports://{tenant}/summary")
    assert content["mimeType"] == "application/json"
    assert json.loads(content["text"]) == {
        "tenant": tenant,
        "summary": f"{tenant}: 3 reports this month",
        "replica": "r1",
    }


async def test_templates_list(http: aiohttp.ClientSession, r1: BackendProcess) -> None:
    answer = await result(http, r1.url, "resources/templates/list")
    assert {t["uriTemplate"] for t in answer["resourceTemplates"]} == TEMPLATES
    assert "nextCursor" not in answer
    assert_uncached_hints(answer)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("reports://acme/reports/42", {"tenant": "acme", "id": "42"}),
        ("reports://globex/reports/a%20b", {"tenant": "globex", "id": "a b"}),
        ("reports://acme/files/q1/sales.csv", {"tenant": "acme", "path": "q1/sales.csv"}),
        ("reports://acme/search?q=late&limit=3", {"tenant": "acme", "q": "late", "limit": 3}),
        ("reports://globex/search", {"tenant": "globex", "q": "", "limit": 10}),
    ],
)
@pytest.mark.parametrize("index", [0, 1])
async def test_a_template_expanded_uri_reads_back_its_parameters(
    http: aiohttp.ClientSession,
    report_backends: list[BackendProcess],
    index: int,
    uri: str,
    expected: dict[str, Any],
) -> None:
    backend = report_backends[index]
    content = await read(http, backend.url, uri)  # the URI comes back as sent, not decoded
    assert content["mimeType"] == "application/json"
    assert json.loads(content["text"]) == {**expected, "replica": backend.name}


@pytest.mark.parametrize(
    "uri",
    [
        "reports://no-such-resource",
        "reports://acme/reports",  # a template's prefix without its parameter
        "reports://acme/files/../summary",  # matches a template; FastMCP refuses traversal
        "other://acme/summary",
    ],
)
async def test_an_unknown_resource_is_400_invalid_params_with_its_uri(
    http: aiohttp.ClientSession, r1: BackendProcess, uri: str
) -> None:
    status, err = await error(http, r1.url, "resources/read", {"uri": uri})
    assert status == 400
    assert err == {"code": -32602, "message": f"Resource not found: {uri!r}", "data": {"uri": uri}}


# --- Mcp-Name ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "params", "field"),
    [
        ("prompts/get", {"name": "report_greeting"}, "name"),
        ("resources/read", {"uri": "reports://about"}, "uri"),
    ],
)
@pytest.mark.parametrize("header", ["wrong", None])
async def test_the_backend_itself_requires_a_matching_mcp_name(
    http: aiohttp.ClientSession,
    r1: BackendProcess,
    method: str,
    params: JsonObject,
    field: str,
    header: str | None,
) -> None:
    """FastMCP refuses a missing Mcp-Name as well as a wrong one: a relay must send it."""
    body = build_request(method, params, id=next(ids))
    if header is None:
        answer = await post_raw(http, r1.url, body, drop=("Mcp-Name",))
    else:
        answer = await post_raw(http, r1.url, body, headers={"Mcp-Name": header})
    assert answer.status == 400
    assert answer.message["error"] == {
        "code": -32020,
        "message": f"mcp-name header does not match the request body's {field!r} parameter",
    }


# --- completions -------------------------------------------------------------------------


async def test_completion_of_prompt_arguments(
    http: aiohttp.ClientSession, r1: BackendProcess
) -> None:
    ref = {"type": "ref/prompt", "name": "report_summarize"}
    assert await complete(http, r1.url, ref, "tenant", "a") == {"values": ["acme"]}
    assert await complete(http, r1.url, ref, "period", "") == {
        "values": ["day", "week", "month", "quarter", "year"]
    }


@pytest.mark.parametrize("index", [0, 1])
async def test_completion_values_for_report_ids_name_the_replica(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess], index: int
) -> None:
    """Report ids are minted per replica, so a completion shows which backend answered."""
    backend = report_backends[index]
    name = backend.name
    prompt = {"type": "ref/prompt", "name": "report_summarize"}
    template = {"type": "ref/resource", "uri": REPORT_TEMPLATE}
    expected = {"values": [f"{name}-1", f"{name}-2", f"{name}-3"]}
    assert await complete(http, backend.url, prompt, "report_id", "") == expected
    context = {"tenant": "acme"}
    assert await complete(http, backend.url, template, "id", "", context) == expected
    assert await complete(http, backend.url, template, "id", f"{name}-2") == {
        "values": [f"{name}-2"]
    }


async def test_completion_of_a_template_parameter(
    http: aiohttp.ClientSession, r1: BackendProcess
) -> None:
    template = {"type": "ref/resource", "uri": REPORT_TEMPLATE}
    assert await complete(http, r1.url, template, "tenant", "") == {"values": ["acme", "globex"]}
    assert await complete(http, r1.url, template, "tenant", "g") == {"values": ["globex"]}


@pytest.mark.parametrize(
    "ref",
    [
        {"type": "ref/prompt", "name": "no_such_prompt"},
        {"type": "ref/prompt", "name": "report_greeting"},  # exists, has no arguments
        {"type": "ref/resource", "uri": "reports://{tenant}/nothing/{x}"},
        {"type": "ref/resource", "uri": "reports://acme/summary"},  # a plain URI
    ],
)
async def test_completion_of_an_unknown_ref_is_empty_not_an_error(
    http: aiohttp.ClientSession, r1: BackendProcess, ref: JsonObject
) -> None:
    """FastMCP hands every ref to the one handler; ours answers None for the ones it does not
    know, which FastMCP sends as an empty completion with HTTP 200."""
    assert await complete(http, r1.url, ref, "tenant", "") == {"values": []}


# --- paging ------------------------------------------------------------------------------


async def collect_pages(
    http: aiohttp.ClientSession, url: str, method: str, key: str
) -> list[list[JsonObject]]:
    """Follow nextCursor to the end; every page must carry the same hints."""
    pages: list[list[JsonObject]] = []
    cursor: str | None = None
    while True:
        params = {"cursor": cursor} if cursor is not None else {}
        answer = await result(http, url, method, params)
        assert_uncached_hints(answer)
        pages.append(answer[key])
        cursor = answer.get("nextCursor")
        if cursor is None:
            return pages
        assert isinstance(cursor, str)
        assert cursor
        assert len(pages) <= 10, "paging does not end"


@pytest.mark.parametrize(
    ("method", "key", "field", "fixed"),
    [
        ("prompts/list", "prompts", "name", len(PROMPTS)),
        ("resources/list", "resources", "uri", len(RESOURCES)),
        ("resources/templates/list", "resourceTemplates", "uriTemplate", len(TEMPLATES)),
    ],
)
async def test_a_paged_backend_lists_every_item_once(
    http: aiohttp.ClientSession,
    paged: BackendProcess,
    method: str,
    key: str,
    field: str,
    fixed: int,
) -> None:
    pages = await collect_pages(http, paged.url, method, key)
    total = fixed + MANY
    assert [len(page) for page in pages] == [PAGE_SIZE] * (total // PAGE_SIZE) + (
        [total % PAGE_SIZE] if total % PAGE_SIZE else []
    )
    names = [item[field] for page in pages for item in page]
    assert len(names) == len(set(names)) == total


async def test_the_paged_items_are_served(
    http: aiohttp.ClientSession, paged: BackendProcess
) -> None:
    last = f"{MANY - 1:04d}"
    answer = await get_prompt(http, paged.url, f"bulk_{last}")
    assert texts(answer) == [f"Bulk prompt {last} (replica p1)."]
    content = await read(http, paged.url, "reports://bulk/0000")
    assert content["text"] == "Bulk resource 0000 (replica p1)."
    content = await read(http, paged.url, "reports://bulk/0003/x")
    assert content["text"] == "Bulk item 0003/x (replica p1)."


async def test_a_paged_list_refuses_a_bogus_cursor_and_takes_empty_as_the_start(
    http: aiohttp.ClientSession, paged: BackendProcess
) -> None:
    status, err = await error(http, paged.url, "prompts/list", {"cursor": "bogus"})
    assert status == 400
    assert err == {"code": -32602, "message": "Invalid cursor: bogus"}
    # "" is falsy to FastMCP: it restarts the list rather than naming a page.
    first = await result(http, paged.url, "prompts/list")
    empty = await result(http, paged.url, "prompts/list", {"cursor": ""})
    assert empty["prompts"] == first["prompts"]
    assert empty["nextCursor"] == first["nextCursor"]


async def test_paging_leaves_a_short_tools_list_whole(
    http: aiohttp.ClientSession, paged: BackendProcess
) -> None:
    """list_page_size applies to tools/list too; six tools fit in one page of ten."""
    answer = await result(http, paged.url, "tools/list")
    assert len(answer["tools"]) == 6
    assert "nextCursor" not in answer
