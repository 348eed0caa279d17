"""A backend's own list_changed, relayed at once (issue 24, item 1): two replicas of the
`listing` backend (backends/listing.py, the `mcp` SDK's MCPServer, which serves
subscriptions/listen and pushes list_changed when its tools or prompts change) behind a real
taskgate whose catalogue refreshes only every 60 s, so that only taskgate's own upstream list
listen can explain a notification that comes sooner. Each tenant is told only of a change to
what it sees; a burst of pushes costs a refresh in flight and at most one more; the listens
end with the last stream that asks for a list, a restarted replica is listened to again, and
a reload moves them to the replicas it configures."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gateway.config import load_config
from gateway.listen.list_listens import Coalesced, ListListens
from gateway.process.serve import Source, running
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import Issuer, jwt_auth
from tests.support.listen import (
    ListenStream,
    listening,
    next_event,
    replica_tool,
    streams_become,
    subscription_id,
)
from tests.support.listing import ListingBackendProcess
from tests.support.mcp import poll_until
from tests.support.procs import BackendProcess, stop_all

WITHIN = 20.0  # seconds any one expected event or condition may take
REFRESH_S = 60.0  # the catalogue's refresh, and so the digest polling's period
QUIET_S = 0.5  # how long a stream is watched for an event that must not come
TOOLS_CHANGED = "notifications/tools/list_changed"
PROMPTS_CHANGED = "notifications/prompts/list_changed"
FLAGS = {"toolsListChanged": True, "promptsListChanged": True}

# acme sees the tools named acme_*, globex those named globex_*; both see every prompt. The
# FastMCP report replicas do not push (listChanged false): no list listen goes to them.
ROUTES: list[Any] = [
    {"tools": ["acme_*"], "backend": "lists", "tenants": ["acme"]},
    {"tools": ["globex_*"], "backend": "lists", "tenants": ["globex"]},
    {"prompts": ["*"], "backend": "lists"},
    (["echo"], "reports"),
]


def start_listing(names: list[str]) -> list[ListingBackendProcess]:
    backends = [ListingBackendProcess(name) for name in names]
    try:
        for backend in backends:
            backend.launch()
        for backend in backends:
            backend.wait_ready()
    except BaseException:
        stop_all(backends)
        raise
    return backends


@pytest.fixture(scope="module")
def listing_backends() -> Iterator[list[ListingBackendProcess]]:
    """Two replicas, "l1" and "l2", each with its own in-memory event bus. Every test leaves
    them serving the same lists (a change made on one is made on the other too)."""
    backends = start_listing(["l1", "l2"])
    try:
        yield backends
    finally:
        stop_all(backends)


def lists_config(
    issuer: Issuer, listing: list[ListingBackendProcess], reports: list[BackendProcess]
) -> Any:
    return gateway_config(
        {"lists": [b.url for b in listing], "reports": [r.url for r in reports]},
        ROUTES,
        auth=jwt_auth(issuer),
        discovery={"refresh_s": REFRESH_S},
    )


@pytest.fixture
async def gateway(
    issuer: Issuer,
    listing_backends: list[ListingBackendProcess],
    report_backends: list[BackendProcess],
) -> AsyncIterator[RunningGateway]:
    async with serving(lists_config(issuer, listing_backends, report_backends)) as running:
        yield running


def pushes_of(gateway: RunningGateway) -> ListListens:
    return gateway.state.listens.lists.pushes


async def settled(gateway: RunningGateway, acknowledged: int) -> None:
    """Wait until `acknowledged` upstream list listens are acknowledged and no refresh runs:
    what the listens' first refreshes compare is behind, and a change made now is a push."""
    pushes = pushes_of(gateway)

    async def state() -> tuple[int, bool]:
        return pushes.acknowledged, pushes.refreshing

    await poll_until(state, lambda found: found == (acknowledged, False), within=WITHIN)


async def acknowledged(stream: ListenStream) -> None:
    ack = await next_event(stream)
    assert ack["method"] == "notifications/subscriptions/acknowledged", ack
    assert ack["params"]["notifications"] == FLAGS


async def nothing_comes(stream: ListenStream) -> None:
    """No event on `stream` for QUIET_S. Called once a stream of another tenant has received
    the change's event: taskgate compared every tenant's lists in that same step."""
    try:
        found = await next_event(stream, within=QUIET_S)
    except TimeoutError:
        return
    raise AssertionError(f"an event came: {found}")


async def set_tool(
    http: aiohttp.ClientSession, replica: BackendProcess, name: str, on: bool = True
) -> None:
    """Add or remove a tool on one replica, directly: it pushes tools/list_changed."""
    await replica_tool(http, replica, "set_tool", tool=name, on=on)


def changed(method: str, listen_id: int | str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": method,
        "params": {"_meta": {"io.modelcontextprotocol/subscriptionId": listen_id}},
    }


# --- the push reaches the tenants that see the change ------------------------------------


async def test_a_pushed_tools_change_reaches_at_once_only_the_tenant_that_sees_it(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    listing_backends: list[ListingBackendProcess],
) -> None:
    l1, l2 = listing_backends
    async with (
        listening(http, gateway.url, FLAGS, id="a", token=issuer.token("acme", "ann")) as acme,
        listening(http, gateway.url, FLAGS, id=7, token=issuer.token("globex", "gil")) as globex,
    ):
        await acknowledged(acme)
        await acknowledged(globex)
        # one shared list listen per replica of the backend that pushes; none to FastMCP
        await settled(gateway, 2)
        assert pushes_of(gateway).listens == 2
        # A tool only acme's route shows appears on one replica, which pushes: taskgate reads
        # that replica's lists at once, long before its 60 s refresh would.
        sent = time.monotonic()
        await set_tool(http, l1, "acme_invoice")
        assert await next_event(acme) == changed(TOOLS_CHANGED, "a")
        assert time.monotonic() - sent < REFRESH_S / 3
        await nothing_comes(globex)
        # The same change on the other replica: acme sees nothing new, so nothing is sent.
        await set_tool(http, l2, "acme_invoice")
        await settled(gateway, 2)
        # globex's turn: its tool appears on both replicas; acme is told nothing.
        await set_tool(http, l2, "globex_ledger")
        assert await next_event(globex) == changed(TOOLS_CHANGED, 7)
        await nothing_comes(acme)
        await set_tool(http, l1, "globex_ledger")
        await settled(gateway, 2)
        await nothing_comes(acme)
        await nothing_comes(globex)


async def test_a_pushed_prompts_change_reaches_every_tenant_that_sees_prompts(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    listing_backends: list[ListingBackendProcess],
) -> None:
    l1, l2 = listing_backends
    tools_only = {"toolsListChanged": True}
    async with (
        listening(http, gateway.url, FLAGS, id=1, token=issuer.token("acme", "ann")) as acme,
        listening(http, gateway.url, FLAGS, id=2, token=issuer.token("globex", "gil")) as globex,
        listening(
            http, gateway.url, tools_only, id=3, token=issuer.token("acme", "ada")
        ) as no_prompts,
    ):
        await acknowledged(acme)
        await acknowledged(globex)
        ack = await next_event(no_prompts)
        assert ack["params"]["notifications"] == tools_only
        await settled(gateway, 2)
        await replica_tool(http, l2, "set_prompt", prompt="weekly_summary", on=True)
        for stream, listen_id in ((acme, 1), (globex, 2)):
            event = await next_event(stream)
            assert event == changed(PROMPTS_CHANGED, listen_id)
            assert type(subscription_id(event)) is int
        # acme's other stream asked for tools only: a prompt change is not its business
        await nothing_comes(no_prompts)
        await replica_tool(http, l1, "set_prompt", prompt="weekly_summary", on=True)
        await settled(gateway, 2)
        await nothing_comes(acme)


async def test_a_burst_of_pushes_costs_few_refreshes_and_one_notification(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    listing_backends: list[ListingBackendProcess],
) -> None:
    l1, l2 = listing_backends
    burst = 200
    async with listening(
        http, gateway.url, FLAGS, id="b", token=issuer.token("acme", "ann")
    ) as acme:
        await acknowledged(acme)
        await settled(gateway, 2)
        before = pushes_of(gateway).refreshes
        # 200 pushes that change nothing, then one that adds acme's tool, in one burst
        found = await replica_tool(
            http, l1, "announce", kind="tools", count=burst, then_tool="acme_burst"
        )
        assert found == {"pushed": burst + 1}
        assert await next_event(acme) == changed(TOOLS_CHANGED, "b")
        await settled(gateway, 2)
        refreshes = pushes_of(gateway).refreshes - before
        # Coalesced: one refresh in flight and one more waiting at any time, never one per push.
        assert 1 <= refreshes < burst // 4, refreshes
        await nothing_comes(acme)
        await set_tool(http, l2, "acme_burst")
        await settled(gateway, 2)


# --- the listens' lifetime -----------------------------------------------------------------


async def test_the_list_listens_end_with_the_last_stream_that_asks_for_a_list(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    gateway: RunningGateway,
    listing_backends: list[ListingBackendProcess],
) -> None:
    pushes = pushes_of(gateway)
    await streams_become(http, listing_backends, 0)  # what earlier tests held is gone
    token = issuer.token("acme", "ann")
    async with (
        listening(http, gateway.url, FLAGS, id=1, token=token) as one,
        listening(http, gateway.url, FLAGS, id=2, token=token) as two,
    ):
        await acknowledged(one)
        await acknowledged(two)
        await settled(gateway, 2)
        # two streams, one upstream list listen per replica
        await streams_become(http, listing_backends, 1)
    async with asyncio.timeout(WITHIN):
        await gateway.state.listens.idle.wait()
    assert pushes.listens == 0
    await streams_become(http, listing_backends, 0)  # each replica saw its listen end


@pytest.fixture
def lone() -> Iterator[ListingBackendProcess]:
    """A replica of its own: the test restarts it, which forgets what was added to it."""
    (backend,) = start_listing(["lone"])
    try:
        yield backend
    finally:
        stop_all([backend])


@pytest.mark.parametrize("how", ["crash", "graceful"])
async def test_a_restarted_replica_is_listened_to_again_and_its_change_told(
    http: aiohttp.ClientSession, issuer: Issuer, lone: ListingBackendProcess, how: str
) -> None:
    config = gateway_config(
        {"lists": [lone.url]},
        ROUTES[:1],
        auth=jwt_auth(issuer),
        discovery={"refresh_s": REFRESH_S},
    )
    async with (
        serving(config) as gateway,
        listening(http, gateway.url, FLAGS, id="r", token=issuer.token("acme", "ann")) as acme,
    ):
        ack = await next_event(acme)
        assert ack["params"]["notifications"] == {"toolsListChanged": True}  # no prompts routed
        await settled(gateway, 1)
        await set_tool(http, lone, "acme_temporary")
        assert await next_event(acme) == changed(TOOLS_CHANGED, "r")
        if how == "crash":
            await asyncio.to_thread(lone.kill)  # SIGKILL: the upstream listen breaks off
            await asyncio.to_thread(lone.start)  # on the same port, without acme_temporary
        else:
            await asyncio.to_thread(lone.restart)  # SIGTERM: MCPServer ends the listen first
        # Nothing is replayed: the new acknowledgement is followed by a refresh, which finds
        # the tool gone, long before the 60 s refresh.
        assert await next_event(acme) == changed(TOOLS_CHANGED, "r")
        await settled(gateway, 1)
        await set_tool(http, lone, "acme_again")
        assert await next_event(acme) == changed(TOOLS_CHANGED, "r")


async def test_after_a_reload_the_list_listens_follow_the_new_replicas(
    http: aiohttp.ClientSession, tmp_path: Path, listing_backends: list[ListingBackendProcess]
) -> None:
    l1, l2 = listing_backends
    path = tmp_path / "taskgate.yaml"

    def write(replica: ListingBackendProcess) -> None:
        document = {
            "listen": {"host": "127.0.0.1", "port": 0},
            "store": {"url": "sqlite:///:memory:"},
            "discovery": {"refresh_s": REFRESH_S},
            "backends": {"lists": {"replicas": [replica.url]}},
            "routes": [{"tools": ["shown_*"], "backend": "lists"}],
        }
        path.write_text(yaml.safe_dump(document))

    write(l1)
    source = Source(str(path), path.read_bytes())
    async with running(load_config(path), source=source, drain_timeout_s=0) as process:
        gateway = RunningGateway(
            url=process.url, state=process.state, server=process.server, admin_url=None
        )
        tools_only = {"toolsListChanged": True}
        async with listening(http, gateway.url, tools_only, id=5) as stream:
            assert (await next_event(stream))["params"]["notifications"] == tools_only
            await settled(gateway, 1)
            write(l2)  # the same lists, served by the other replica
            assert process.reloader is not None
            entry = await process.reloader.reload("SIGHUP")
            assert entry.applied, entry.problems
            await settled(gateway, 1)
            await streams_become(http, [l1], 0)  # the listen on the replica it removed ended
            await set_tool(http, l2, "shown_after_reload")
            assert await next_event(stream) == changed(TOOLS_CHANGED, 5)
    await set_tool(http, l1, "shown_after_reload")  # both replicas serve the same lists again


# --- coalescing ----------------------------------------------------------------------------


async def test_asks_while_a_refresh_runs_become_one_more_run_with_the_latest() -> None:
    runs: list[int] = []
    running = asyncio.Event()
    release = asyncio.Event()

    async def work(argument: int) -> None:
        runs.append(argument)
        running.set()
        await release.wait()

    refresh: Coalesced[int] = Coalesced(work)
    refresh.ask(0)
    async with asyncio.timeout(WITHIN):
        await running.wait()
    for argument in range(1, 100):
        refresh.ask(argument)
    release.set()
    assert refresh.task is not None
    async with asyncio.timeout(WITHIN):
        await refresh.task
    assert runs == [0, 99]
    assert refresh.runs == 2
    # once idle, the next ask runs at once
    refresh.ask(100)
    async with asyncio.timeout(WITHIN):
        await refresh.task
    assert runs == [0, 99, 100]
