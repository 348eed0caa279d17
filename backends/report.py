"""The `report` demo backend: a FastMCP server with one task tool and a few probes, plus
prompts, resources, resource templates and completions, each answer naming its replica."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import signal
import socket
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import timedelta
from types import FrameType
from typing import Any, Literal

import mcp_types
from fastmcp import Context, FastMCP
from fastmcp.prompts import Message, PromptResult
from fastmcp.resources import ResourceContent, ResourceResult
from fastmcp.server.elicitation import AcceptedElicitation
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension

# pydantic needs typing_extensions' TypedDict before Python 3.12 to build the output schema.
from typing_extensions import TypedDict

APPROVE_KEY = "approve_outline"
APPROVE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}},
    "required": ["approved"],
}

# The tenants the resources and completions know; a tenant's resources live under
# reports://<tenant>/, so a gateway can route them by URI.
TENANTS = ("acme", "globex")
PERIODS = ("day", "week", "month", "quarter", "year")
# A 1x1 PNG, served by the `report_chart` prompt and the `reports://logo.png` resource.
PNG_BASE64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA"
    "60e6kgAAAABJRU5ErkJggg=="
)
PNG_BYTES = base64.b64decode(PNG_BASE64)
# The resource templates; completions answer for REPORT_TEMPLATE's parameters.
REPORT_TEMPLATE = "reports://{tenant}/reports/{id}"
FILE_TEMPLATE = "reports://{tenant}/files/{path*}"
SEARCH_TEMPLATE = "reports://{tenant}/search{?q,limit}"

# Process-wide, not per-server: tests read them through `stats` to see what a
# client disconnect did to an in-flight `slow_count`.
SLOW_COUNTS: Counter[str] = Counter()


class ReportResult(TypedDict):
    """The structured result of a finished `generate_report`."""

    size: str
    approved: bool
    replica: str


def approval_request(size: str) -> mcp_types.InputRequiredResult:
    """The single elicitation `generate_report` asks before it finishes."""
    params = mcp_types.ElicitRequestFormParams(
        message=f"Approve the outline of the {size} report?",
        requested_schema=APPROVE_SCHEMA,
    )
    request = mcp_types.ElicitRequest(params=params)
    return mcp_types.InputRequiredResult(input_requests={APPROVE_KEY: request})


def approved_from(responses: Mapping[str, Any]) -> bool:
    """Read the one approval answer, whatever key it arrived under.

    On the wire a task's request travels under a key the tasks extension mints
    (`<taskId>:<hex>`) and is translated back before the next leg; a foreground
    call is answered under our own key. Only one request is ever outstanding, so
    the single response is the answer, an `ElicitResult` or a plain dict. A
    declined or cancelled elicitation counts as not approved.
    """
    (answer,) = responses.values()
    if isinstance(answer, Mapping):
        action, content = answer.get("action"), answer.get("content")
    else:
        action, content = getattr(answer, "action", None), getattr(answer, "content", None)
    return action == "accept" and isinstance(content, Mapping) and content.get("approved") is True


def build_server(
    replica: str,
    tasks_url: str = "memory://",
    *,
    many: int = 0,
    page_size: int | None = None,
    poll_interval_ms: int | None = None,
    asking: bool = False,
    ask_name: str = "ask",
) -> FastMCP:
    """Build the report server for one replica, its tasks stored at `tasks_url`.

    `many` adds that many numbered prompts, resources and templates; `page_size`
    makes FastMCP page every list (it pages none by default); `poll_interval_ms` is the
    `pollIntervalMs` its tasks advertise (FastMCP's default, 5000, when None); `asking` adds
    the `ask` tool (off by default, so that every other test sees the same tool list).
    """
    mcp = FastMCP("report", list_page_size=page_size)
    mcp.add_extension(TasksExtension(url=tasks_url))

    task: bool | TaskConfig = True
    if poll_interval_ms is not None:
        task = TaskConfig(mode="optional", poll_interval=timedelta(milliseconds=poll_interval_ms))

    @mcp.tool(task=task)
    async def generate_report(
        size: str, ctx: Context, delay_ms: int = 0
    ) -> ReportResult | mcp_types.InputRequiredResult:
        """Generate a report after the client approves its outline; `delay_ms` of work first."""
        responses = ctx.input_responses
        if not responses:
            await asyncio.sleep(delay_ms / 1000)  # the task stays "working" meanwhile
            return approval_request(size)
        return ReportResult(size=size, approved=approved_from(responses), replica=replica)

    @mcp.tool
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @mcp.tool
    def whoami() -> dict[str, str]:
        """Name the replica that answered."""
        return {"replica": replica}

    @mcp.tool
    async def slow_count(n: int, delay_ms: int, ctx: Context) -> int:
        """Count to n, reporting progress each step, pausing delay_ms between steps."""
        SLOW_COUNTS["started"] += 1
        try:
            for i in range(1, n + 1):
                await asyncio.sleep(delay_ms / 1000)
                await ctx.report_progress(i, n)
        except asyncio.CancelledError:
            SLOW_COUNTS["cancelled"] += 1
            raise
        SLOW_COUNTS["completed"] += 1
        return n

    @mcp.tool
    def stats() -> dict[str, Any]:
        """Report how many slow_count calls started, were cancelled and completed."""
        return {
            "replica": replica,
            "slow_started": SLOW_COUNTS["started"],
            "slow_cancelled": SLOW_COUNTS["cancelled"],
            "slow_completed": SLOW_COUNTS["completed"],
        }

    @mcp.tool
    def set_visible(
        kind: Literal["prompt", "resource", "template", "tool"], name: str, on: bool
    ) -> str:
        """Show or hide one prompt, resource, template or tool of this replica (by name or URI):
        how tests change what a backend serves while it runs."""
        if on:
            mcp.enable(names={name}, components={kind})
        else:
            mcp.disable(names={name}, components={kind})
        return f"{kind} {name} {'shown' if on else 'hidden'}"

    if asking:
        add_ask(mcp, replica, ask_name)
    add_prompts(mcp, replica)
    add_resources(mcp, replica)
    add_completions(mcp, replica)
    add_many(mcp, replica, many)
    return mcp


def add_ask(mcp: FastMCP, replica: str, name: str = "ask") -> None:
    """`ask`: a 2025-era elicitation in the middle of a tool call (`elicitation/create` on the
    call's SSE stream, answered by the client's POST in the same session). FastMCP refuses it
    on a 2026-07-28 request, which has no back channel."""

    @mcp.tool(name=name)
    async def ask(question: str, ctx: Context) -> str:
        """Ask the client `question`; answer `<replica>:<action>:<the text it gave>`."""
        result = await ctx.elicit(question, response_type=str)
        value = result.data if isinstance(result, AcceptedElicitation) else ""
        return f"{replica}:{result.action}:{value}"


def json_text(**fields: Any) -> str:
    """Compact, key-sorted JSON, so the bytes are the same on every read."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


def summary_text(tenant: str, replica: str) -> str:
    """The JSON body of reports://<tenant>/summary."""
    return json_text(tenant=tenant, summary=f"{tenant}: 3 reports this month", replica=replica)


def report_ids(replica: str) -> list[str]:
    """The report ids a replica suggests in completions: minted per replica, so a
    completion answer shows which backend gave it."""
    return [f"{replica}-{n}" for n in (1, 2, 3)]


def add_prompts(mcp: FastMCP, replica: str) -> None:
    """Four prompts: no arguments, required and optional arguments, an embedded
    resource, an image. Every answer names the replica in a text."""

    @mcp.prompt
    def report_greeting() -> str:
        """Say hello; takes no arguments."""
        return f"Hello from the report backend, replica {replica}."

    @mcp.prompt
    def report_summarize(tenant: str, period: str = "month", report_id: str = "") -> str:
        """Ask for a summary of a tenant's reports over a period."""
        which = f" report {report_id}" if report_id else " reports"
        return f"Summarize {tenant}'s{which} for the last {period} (replica {replica})."

    @mcp.prompt
    def report_embedded(tenant: str) -> PromptResult:
        """Embed the tenant's summary resource in the prompt."""
        resource = mcp_types.TextResourceContents(
            uri=f"reports://{tenant}/summary",
            mime_type="application/json",
            text=summary_text(tenant, replica),
        )
        return PromptResult(
            [
                Message(mcp_types.EmbeddedResource(type="resource", resource=resource)),
                Message(f"Comment on this summary (replica {replica})."),
            ]
        )

    @mcp.prompt
    def report_chart() -> PromptResult:
        """Show a chart: an image, then a text naming the replica."""
        image = mcp_types.ImageContent(type="image", data=PNG_BASE64, mime_type="image/png")
        return PromptResult([Message(image), Message(f"Describe this chart (replica {replica}).")])


def add_resources(mcp: FastMCP, replica: str) -> None:
    """Static text and blob resources, one summary per tenant, and three templates."""

    @mcp.resource("reports://about", mime_type="text/plain")
    def about() -> str:
        """What this backend is, and which replica answered."""
        return f"The report backend, replica {replica}."

    @mcp.resource("reports://logo.png", mime_type="image/png")
    def logo() -> ResourceResult:
        """A 1x1 PNG as a blob; the replica is in the content's _meta."""
        content = ResourceContent(PNG_BYTES, mime_type="image/png", meta={"replica": replica})
        return ResourceResult([content])

    for tenant in TENANTS:
        add_summary(mcp, tenant, replica)

    @mcp.resource(REPORT_TEMPLATE, mime_type="application/json")
    def tenant_report(tenant: str, id: str) -> str:
        """One report of a tenant, by id."""
        return json_text(tenant=tenant, id=id, replica=replica)

    @mcp.resource(FILE_TEMPLATE, mime_type="application/json")
    def tenant_file(tenant: str, path: str) -> str:
        """A file under a tenant's folder; the path may span segments."""
        return json_text(tenant=tenant, path=path, replica=replica)

    @mcp.resource(SEARCH_TEMPLATE, mime_type="application/json")
    def tenant_search(tenant: str, q: str = "", limit: int = 10) -> str:
        """Search a tenant's reports; the query parameters are optional."""
        return json_text(tenant=tenant, q=q, limit=limit, replica=replica)


def add_summary(mcp: FastMCP, tenant: str, replica: str) -> None:
    """reports://<tenant>/summary, a JSON text."""

    @mcp.resource(
        f"reports://{tenant}/summary", name=f"{tenant}_summary", mime_type="application/json"
    )
    def summary() -> str:
        return summary_text(tenant, replica)


def add_completions(mcp: FastMCP, replica: str) -> None:
    """Completions for report_summarize's arguments and the report template's parameters."""

    @mcp.completion
    def complete(
        ref: mcp_types.PromptReference | mcp_types.ResourceTemplateReference,
        argument: mcp_types.CompletionArgument,
        context: mcp_types.CompletionContext | None,
    ) -> list[str] | None:
        if isinstance(ref, mcp_types.PromptReference):
            handled = ref.name == "report_summarize"
        else:
            handled = ref.uri == REPORT_TEMPLATE
        if not handled:
            return None
        candidates = {
            "tenant": list(TENANTS),
            "period": list(PERIODS),
            "report_id": report_ids(replica),
            "id": report_ids(replica),
        }.get(argument.name, [])
        return [value for value in candidates if value.startswith(argument.value)]


def add_many(mcp: FastMCP, replica: str, count: int) -> None:
    """`count` numbered prompts, resources and templates, for lists longer than a page."""
    for n in range(count):
        add_numbered(mcp, replica, f"{n:04d}")


def add_numbered(mcp: FastMCP, replica: str, number: str) -> None:
    """bulk_<number>, reports://bulk/<number> and reports://bulk/<number>/{item}."""

    @mcp.prompt(name=f"bulk_{number}")
    def bulk_prompt() -> str:
        return f"Bulk prompt {number} (replica {replica})."

    @mcp.resource(f"reports://bulk/{number}", name=f"bulk_{number}", mime_type="text/plain")
    def bulk_resource() -> str:
        return f"Bulk resource {number} (replica {replica})."

    @mcp.resource(
        f"reports://bulk/{number}/{{item}}", name=f"bulk_{number}_item", mime_type="text/plain"
    )
    def bulk_template(item: str) -> str:
        return f"Bulk item {number}/{item} (replica {replica})."


def listen(host: str, port: int) -> socket.socket:
    """Bind and listen ourselves so `--port 0` yields a port we can announce."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def announce(sock: socket.socket) -> str:
    """Print the one READY line a parent process waits for."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/mcp"
    print(f"READY {url}", flush=True)
    return url


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    """Exit quietly; uvicorn re-raises SIGTERM/SIGINT here after a graceful stop."""
    raise SystemExit(0)


async def serve(mcp: FastMCP, sock: socket.socket, host: str, *, stateful: bool = False) -> None:
    """Serve MCP over streamable HTTP at /mcp; announce once the lifespans are up.

    `stateful` keeps 2025-era sessions (Mcp-Session-Id, the GET stream, DELETE): a
    server-to-client request such as `ask`'s elicitation needs one, because the client's answer
    arrives in a POST of its own, which a stateless server cannot tie to the waiting call.
    Requests of 2026-07-28 are served the same either way (FastMCP routes them by their
    MCP-Protocol-Version header before any session handling).

    READY waits for the server's started event (set after the task store and
    its worker are running), so a broken --tasks-url fails before READY rather
    than on a test's first request. The socket already listens, so connections
    made in the moment before uvicorn accepts are queued by the kernel.
    """
    server = asyncio.create_task(
        mcp.run_http_async(
            show_banner=False,
            host=host,
            port=sock.getsockname()[1],
            log_level="warning",
            path="/mcp",
            stateless_http=not stateful,
            sockets=[sock],
        )
    )
    started = asyncio.create_task(mcp._started.wait())
    await asyncio.wait({server, started}, return_when=asyncio.FIRST_COMPLETED)
    if started.done():
        announce(sock)
    else:
        started.cancel()
    await server


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(prog="python -m backends.report", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument("--replica", required=True, help="name reported by whoami")
    parser.add_argument("--host", default="127.0.0.1", help="loopback by default")
    parser.add_argument("--tasks-url", default="memory://", help="Docket backend URL")
    parser.add_argument(
        "--many",
        type=int,
        default=0,
        metavar="N",
        help="also serve N numbered prompts, resources and resource templates",
    )
    parser.add_argument(
        "--page-size",
        type=int,
        default=None,
        metavar="N",
        help="page every list N items at a time (FastMCP pages nothing by default)",
    )
    parser.add_argument(
        "--poll-interval-ms",
        type=int,
        default=None,
        metavar="MS",
        help="the pollIntervalMs generate_report's tasks advertise (FastMCP's default: 5000)",
    )
    parser.add_argument(
        "--asking",
        action="store_true",
        help="also serve `ask`, which elicits an answer from a 2025-era client; the server then "
        "keeps 2025-era sessions, which the elicitation's answer needs",
    )
    parser.add_argument(
        "--ask-name",
        default="ask",
        help="the name of the --asking tool (two backends of one gateway need two names)",
    )
    return parser.parse_args(argv)


def prepare_process(host: str) -> None:
    """What a demo backend process does first: loopback only, warnings to stderr, and a clean
    exit on SIGTERM and SIGINT."""
    if host in ("0.0.0.0", "::", ""):
        sys.exit("refusing to listen on all interfaces; pass a loopback --host")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one replica until SIGTERM or SIGINT."""
    args = parse_args(argv)
    prepare_process(args.host)
    mcp = build_server(
        args.replica,
        args.tasks_url,
        many=args.many,
        page_size=args.page_size,
        poll_interval_ms=args.poll_interval_ms,
        asking=args.asking,
        ask_name=args.ask_name,
    )
    with listen(args.host, args.port) as sock:
        asyncio.run(serve(mcp, sock, args.host, stateful=args.asking))
    return 0


if __name__ == "__main__":
    sys.exit(main())
