"""The hot path of one request, piece by piece: what taskgate spends before it relays.

Async calls are measured in one of two ways, named in each case's docstring:
- a path that does I/O (a SQLite or Redis lookup) runs on a private event loop (the loop
  `taskgate run` uses: uvloop when installed), `run_until_complete` inside the benchmarked
  callable; those cases include one trip through the loop, which test_loop_overhead measures
  on its own (an empty coroutine);
- a path that never suspends (token verification with static keys, a route-cache hit) is
  driven to completion without a loop (run_inline), as an `await` in the running gateway runs
  it: a loop trip would cost more than the work itself. run_inline fails if it suspends.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from bench.micro.conftest import RULES, Loop, Signer, run_inline
from gateway.auth import Principal
from gateway.auth.authenticator import JWTAuthenticator
from gateway.auth.jwks import StaticKeys
from gateway.catalog.table import RouteTable
from gateway.config import RouteConfig, TasksConfig
from gateway.protocol import envelope
from gateway.protocol.envelope import RPCNotification, RPCRequest
from gateway.protocol.headers import RoutingHeaders, check_headers
from gateway.protocol.meta import read_meta
from gateway.store.base import TaskRoute, TaskRouteStore, now_ms
from gateway.store.redis_routes import RedisRouteStore
from gateway.store.sqlite_routes import SQLiteRouteStore
from gateway.tasks.routes import TaskRouter
from gateway.upstream.pool import Pool
from tests.support.procs import RedisProcess

PROTOCOL = "2026-07-28"
MAX_DEPTH = 64  # listen.max_json_depth's default
METADATA_URL = "https://gateway.test/.well-known/oauth-protected-resource/mcp"
TASK_ID = "6f1c2a9e-3b7d-4c58-a0e2-9d4f7b1e5c36"
TOOL = "reports.generate_quarterly"
META = {
    "io.modelcontextprotocol/protocolVersion": PROTOCOL,
    "io.modelcontextprotocol/clientCapabilities": {
        "extensions": {"io.modelcontextprotocol/tasks": {}},
        "elicitation": {},
        "sampling": {},
        "roots": {"listChanged": True},
    },
}


def _body(method: str, params: dict[str, Any]) -> bytes:
    return orjson.dumps(
        {
            "jsonrpc": "2.0",
            "id": "req-7f3a9c2e-0b4d-4e8a-9f61-2c5d8e1a7b90",
            "method": method,
            "params": params,
        }
    )


def _arguments() -> dict[str, Any]:
    """A tools/call arguments object of about 2 kB: nested filters, columns and free text."""
    return {
        "report": "quarterly-revenue",
        "format": "pdf",
        "period": {"from": "2026-01-01", "to": "2026-03-31", "timezone": "Europe/Berlin"},
        "filters": {
            "regions": ["emea", "na", "latam", "apac"],
            "products": [f"sku-{n:05d}" for n in range(24)],
            "channels": {"online": True, "retail": True, "partner": False},
            "minimumOrderValue": {"amount": 250.0, "currency": "EUR"},
        },
        "columns": [
            {"name": name, "aggregate": agg, "format": fmt}
            for name, agg, fmt in (
                ("revenue", "sum", "currency"),
                ("orders", "count", "integer"),
                ("average_order", "mean", "currency"),
                ("returns", "sum", "integer"),
                ("margin", "mean", "percent"),
                ("new_customers", "count", "integer"),
            )
        ],
        "groupBy": ["region", "month", "channel"],
        "sort": [{"column": "revenue", "descending": True}, {"column": "region"}],
        "notes": (
            "Prepared for the quarterly business review. Exclude internal test orders and "
            "orders refunded within 14 days; convert every amount at the month-end rate. "
        )
        * 5,
        "delivery": {"email": ["finance@acme.example", "cfo@acme.example"], "attach": True},
    }


GET_BODY = _body("tasks/get", {"taskId": TASK_ID, "_meta": META})
CALL_BODY = _body("tools/call", {"name": TOOL, "arguments": _arguments(), "_meta": META})


def _headers(method: str, name: str, body: bytes) -> CIMultiDictProxy[str]:
    """Headers as aiohttp hands them to the handler (a case-insensitive multidict)."""
    return CIMultiDictProxy(
        CIMultiDict(
            [
                ("Host", "gateway.acme.example"),
                ("User-Agent", "mcp-client/1.4.2 python-httpx/0.28.1"),
                ("Accept", "application/json, text/event-stream"),
                ("Accept-Encoding", "gzip, deflate"),
                ("Connection", "keep-alive"),
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
                ("Authorization", "Bearer eyJhbGciOiJFUzI1NiIsImtpZCI6ImsxIn0.e30.c2ln"),
                ("MCP-Protocol-Version", PROTOCOL),
                ("Mcp-Method", method),
                ("Mcp-Name", name),
                ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            ]
        )
    )


def parse_and_check(body: bytes, headers: CIMultiDictProxy[str]) -> str | None:
    """Step 5 (docs/architecture.md): envelope, _meta, routing headers and version vs the body."""
    message = envelope.parse(body, max_depth=MAX_DEPTH)
    if isinstance(message, RPCNotification):
        raise TypeError("a request was expected")
    meta = read_meta(message)
    return check_headers(message, meta, RoutingHeaders.of(headers), strict=False)


# --- loop overhead -------------------------------------------------------------------------


async def _nothing() -> None:
    return None


@pytest.mark.benchmark(group="loop")
def test_loop_overhead(benchmark: Any, loop: Loop) -> None:
    """run_until_complete of an empty coroutine: included in every async case below."""
    benchmark(lambda: loop.run(_nothing()))


# --- 1. envelope parse + header check ------------------------------------------------------


@pytest.mark.benchmark(group="envelope")
@pytest.mark.parametrize(
    ("body", "method", "name"),
    [
        pytest.param(GET_BODY, "tasks/get", TASK_ID, id="tasks-get"),
        pytest.param(CALL_BODY, "tools/call", TOOL, id="tools-call-2kB"),
    ],
)
def test_parse_and_check(benchmark: Any, body: bytes, method: str, name: str) -> None:
    headers = _headers(method, name, body)
    assert benchmark(parse_and_check, body, headers) == name


@pytest.mark.benchmark(group="envelope")
@pytest.mark.parametrize(
    "body",
    [pytest.param(GET_BODY, id="tasks-get"), pytest.param(CALL_BODY, id="tools-call-2kB")],
)
def test_parse_only(benchmark: Any, body: bytes) -> None:
    """envelope.parse alone, for the share of the whole step it takes."""
    assert isinstance(benchmark(envelope.parse, body, max_depth=MAX_DEPTH), RPCRequest)


def test_body_sizes() -> None:
    """The bodies are the sizes the cases claim (not a benchmark)."""
    assert 300 <= len(GET_BODY) <= 400, len(GET_BODY)
    assert 1900 <= len(orjson.dumps(_arguments())) <= 2200, len(orjson.dumps(_arguments()))


# --- 2. token verification -----------------------------------------------------------------


@pytest.mark.benchmark(group="token")
@pytest.mark.parametrize("cache", ["cold", "cached"])
@pytest.mark.parametrize("alg", ["ES256", "RS256"])
def test_token(benchmark: Any, signers: dict[str, Signer], alg: str, cache: str) -> None:
    """JWTAuthenticator.authenticate with static keys (run_inline): cold verifies every call
    (cache_size=0); cached presents the same token again and again (a hit after the first)."""
    signer = signers[alg]
    auth = JWTAuthenticator(
        RULES,
        StaticKeys((signer.verification_key,)),
        METADATA_URL,
        cache_size=0 if cache == "cold" else 10_000,
    )
    authorization = [f"Bearer {signer.token}"]
    if cache == "cached":
        run_inline(auth.authenticate(authorization))
    principal = benchmark(lambda: run_inline(auth.authenticate(authorization)))
    assert principal == Principal("acme", "alice", frozenset({"tasks", "reports"}))


# --- 3. route lookup + owner check ---------------------------------------------------------

OWNER = Principal("acme", "alice")
ROUTE = TaskRoute(
    task_id=TASK_ID,
    backend="reports",
    replica="http://10.0.3.17:8000/mcp",
    tenant=OWNER.tenant,
    principal=OWNER.subject,
    created_at_ms=now_ms(),
    ttl_ms=3_600_000,
    expires_at_ms=now_ms() + 2 * 3_600_000,
)


@pytest.fixture(scope="module")
def sqlite_store(loop: Loop) -> Iterator[SQLiteRouteStore]:
    """A SQLite store on disk (WAL, synchronous=FULL, as configured) holding ROUTE."""
    with tempfile.TemporaryDirectory(prefix="taskgate-bench-") as tmp:
        store = SQLiteRouteStore(Path(tmp) / "routes.db", timeout_s=2.0)
        loop.run(store.open())
        try:
            loop.run(store.record(ROUTE))
            yield store
        finally:
            loop.run(store.close())


@pytest.fixture(scope="module")
def redis_store(loop: Loop, redis_server: RedisProcess) -> Iterator[RedisRouteStore]:
    """A RedisRouteStore on the session's redis-server holding ROUTE."""
    redis_server.flushall()
    store = RedisRouteStore(redis_server.url, timeout_s=2.0)
    try:
        loop.run(store.record(ROUTE))
        yield store
    finally:
        loop.run(store.close())
        redis_server.flushall()


def _router(store: TaskRouteStore, cache_size: int) -> TaskRouter:
    # The pool is only used to cancel unrecorded tasks, which resolve never does (nothing
    # connects).
    return TaskRouter(store, TasksConfig(), Pool(), cache_size=cache_size)


@pytest.mark.benchmark(group="resolve")
@pytest.mark.parametrize(
    ("store_fixture", "cache_size"),
    [
        pytest.param("sqlite_store", 10_000, id="cache-hit"),
        pytest.param("sqlite_store", 0, id="sqlite-cache-off"),
        pytest.param("redis_store", 0, id="redis-cache-off"),
    ],
)
def test_resolve(
    benchmark: Any, loop: Loop, request: pytest.FixtureRequest, store_fixture: str, cache_size: int
) -> None:
    """TaskRouter.resolve of a task the caller owns: owner-keyed cache first, then the store
    and the owner check. A cache hit never suspends (run_inline); a store lookup runs on the
    loop (Loop.run)."""
    router = _router(request.getfixturevalue(store_fixture), cache_size)
    if cache_size:
        loop.run(router.resolve(TASK_ID, OWNER, 1))
        assert len(router.cache) == 1
    run = run_inline if cache_size else loop.run
    route = benchmark(lambda: run(router.resolve(TASK_ID, OWNER, 1)))
    assert route == ROUTE


# --- 4. the route table --------------------------------------------------------------------


def _route_configs() -> tuple[RouteConfig, ...]:
    """50 routes: 40 with three exact names each, then 10 globs; a third are tenant-scoped."""
    configs = [
        RouteConfig(
            tools=(f"svc{i}.read", f"svc{i}.write", f"svc{i}.list"),
            backend=f"backend-{i % 8}",
            tenants=("acme", "globex") if i % 3 == 0 else None,
        )
        for i in range(40)
    ]
    configs += [
        RouteConfig(
            tools=(f"ns{j}.*",),
            backend=f"backend-{j % 8}",
            tenants=("initech",) if j % 3 == 0 else None,
        )
        for j in range(10)
    ]
    return tuple(configs)


@pytest.mark.benchmark(group="route-table")
@pytest.mark.parametrize("memo", ["warm", "cold"])
@pytest.mark.parametrize(
    ("tool", "index"),
    [pytest.param("svc37.write", 37, id="exact"), pytest.param("ns8.export_csv", 48, id="glob")],
)
def test_route_table(benchmark: Any, tool: str, index: int, memo: str) -> None:
    """RouteTable.lookup on 50 routes: memo warm (the steady state of a repeated tool name)
    and cold (memo_size=0: every lookup scans the exact names and all 10 globs)."""
    table = RouteTable(_route_configs(), memo_size=4096 if memo == "warm" else 0)
    assert len(table.routes) == 50
    route = benchmark(table.lookup, tool, "acme")
    assert route is not None
    assert route.index == index
