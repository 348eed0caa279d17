"""A connection at rest after an answer (DownstreamRequest.pause_s, which the gateway sets for a
caller refused for a limit: limits.pause_refused_ms): what the client sends meanwhile is not
read or started until the rest ends, while other connections are served; the idle timeout
does not end a resting connection; a client that leaves while it rests is let go when the rest
ends.

On real loopback sockets under both event loops (tests/listener/conftest.py), with the server
and raw peers of tests/listener/test_h1_server.py. A rest is a timer set after the refused
request's handler started, so the lower bounds below, from that start on the loop's clock, are
exact (a timer never fires early by more than the clock's resolution), however slow the
machine; no upper bound is asserted but the tests' own.
"""

from __future__ import annotations

import asyncio

from gateway.h1.request import DownstreamRequest, DownstreamResponse, Handler, Reply
from tests.listener.conftest import Run
from tests.listener.test_h1_server import Peer, Served, post, serving

REST_S = 0.3
# asyncio's timers may fire up to its clock resolution early; 10 ms covers both loops.
EARLY_S = 0.01


def resting_after(paths: set[str], rest_s: float, started: dict[str, float]) -> Handler:
    """A handler that answers its path and asks for a rest after those in `paths`, noting when
    each request's handler started."""

    async def handler(request: DownstreamRequest) -> Reply:
        started[request.path] = asyncio.get_running_loop().time()
        await request.read()
        if request.path in paths:
            request.pause_s = rest_s
        return DownstreamResponse(body=request.path.encode())

    return handler


async def refused(served: Served) -> Peer:
    """A connection whose first request was answered with a rest."""
    peer = await served.connect()
    await peer.send(post("/refused", b"a"))
    await peer.answer()
    return peer


def test_a_request_sent_during_a_rest_starts_when_the_rest_ends(run: Run) -> None:
    async def scenario() -> None:
        started: dict[str, float] = {}
        async with serving(resting_after({"/refused"}, REST_S, started)) as served:
            peer = await served.connect()
            # Pipelined: the second request is in hand before the first is answered.
            await peer.send(post("/refused", b"a") + post("/next", b"b"))
            first = await peer.answer()
            # Meanwhile another connection is served at once.
            other = await served.connect()
            await other.send(post("/other", b"c"))
            assert (await other.answer()).body == b"/other"
            assert "/next" not in started
            second = await peer.answer()
            assert started["/next"] - started["/refused"] >= REST_S - EARLY_S
            # Then the connection goes on as before, without resting.
            await peer.send(post("/last", b"d"))
            third = await peer.answer()
        assert (first.body, second.body, third.body) == (b"/refused", b"/next", b"/last")
        assert not any(answer.closes for answer in (first, second, third))

    run(scenario)


def test_a_request_sent_after_the_answer_waits_for_the_rest_too(run: Run) -> None:
    async def scenario() -> None:
        started: dict[str, float] = {}
        async with serving(resting_after({"/refused"}, REST_S, started)) as served:
            peer = await refused(served)
            await peer.send(post("/again", b"b"))  # a client that retries at once
            assert (await peer.answer()).body == b"/again"
            assert started["/again"] - started["/refused"] >= REST_S - EARLY_S

    run(scenario)


def test_the_idle_timeout_does_not_end_a_resting_connection(run: Run) -> None:
    async def scenario() -> None:
        started: dict[str, float] = {}
        handler = resting_after({"/refused"}, 3 * REST_S, started)
        async with serving(handler, keepalive_timeout_s=REST_S / 2) as served:
            peer = await refused(served)
            await peer.send(post("/after", b"b"))
            answer = await peer.answer()
            assert (answer.status, answer.body, answer.closes) == (200, b"/after", False)
            # Idle again, without a rest: the timeout ends it as ever.
            await peer.closed()

    run(scenario)


def test_a_client_that_leaves_during_a_rest_is_let_go_when_it_ends(run: Run) -> None:
    async def scenario() -> None:
        started: dict[str, float] = {}
        loop = asyncio.get_running_loop()
        async with serving(resting_after({"/refused"}, REST_S, started)) as served:
            peer = await refused(served)
            await peer.close()
            # Not read while it rests, the connection learns of the close when the rest ends
            # (docs/limits.md: at most limits.pause_refused_ms).
            await served.forgets_all()
            assert loop.time() - started["/refused"] >= REST_S - EARLY_S
            assert set(started) == {"/refused"}

    run(scenario)


def test_a_peer_that_keeps_sending_during_a_rest_is_held_in_its_socket(run: Run) -> None:
    """Bytes sent during a rest stay in the kernel's buffers: the server reads none, holds none
    (its request-bytes budget stays empty) and starts nothing; after it, every request is
    answered in order under the usual flow control."""

    async def scenario() -> None:
        started: dict[str, float] = {}
        count = 2_000  # far more than the server parses ahead of the one it answers
        async with serving(resting_after({"/refused"}, REST_S, started)) as served:
            peer = await refused(served)
            flood = b"".join(post(f"/r{n}", b"x" * 64) for n in range(count))
            peer.writer.write(flood)  # not drained: the kernel takes what it can, the rest waits
            assert await peer.silent(REST_S / 2)  # nothing answered while it rests
            assert served.server.buffered == 0
            assert set(started) == {"/refused"}
            for n in range(count):
                assert (await peer.answer()).body == f"/r{n}".encode()
            assert started["/r0"] - started["/refused"] >= REST_S - EARLY_S
            assert served.server.buffered == 0

    run(scenario)
