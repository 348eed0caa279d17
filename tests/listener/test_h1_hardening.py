"""What one client must not be able to do to the public listener's server: grow its memory by
pipelining and never reading, park its bytes in it, take every connection, or smuggle a request
past its framing; and what the server must never write. Byte for byte on real loopback sockets,
under asyncio's loop and uvloop, with the helpers of test_h1_server.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.h1.limits import OVER_BUDGET, READ_SIZE, Refused
from gateway.h1.request import DownstreamRequest, DownstreamResponse, Reply
from gateway.h1.server import HTTPConnection
from tests.listener.test_h1_server import (
    SOON,
    Run,
    Served,
    echo,
    get,
    happens,
    post,
    request_head,
    serving,
    until,
)

ANSWER = 256 * 1024


def only_connection(served: Served) -> HTTPConnection:
    (conn,) = served.server.connections
    return conn


# --- flow control: a client that does not read ---------------------------------------------------


def test_a_client_that_never_reads_is_not_answered_past_what_its_socket_holds(run: Run) -> None:
    # Measured before the fix: pipelined GETs answered whole, never read, grew taskgate by
    # 1.3 GB in 10 s. Now no request starts while the client's socket is full.
    async def scenario() -> None:
        buffered_at_start: list[int] = []
        count = 100

        async def handler(request: DownstreamRequest) -> Reply:
            transport = request._conn._transport
            assert transport is not None
            buffered_at_start.append(transport.get_write_buffer_size())
            return DownstreamResponse(body=b"x" * ANSWER, headers={"X-Path": request.path})

        async with serving(handler) as served:
            peer = await served.connect()
            await peer.send(b"".join(get(f"/{n}") for n in range(count)))
            await until(lambda: bool(served.server.connections))
            conn = only_connection(served)
            await until(lambda: conn._write_paused)
            # Stalled: far fewer answers than requests were made, and none was started over a
            # full buffer (the old server had answered all 100 into memory by now).
            assert len(buffered_at_start) < count
            assert max(buffered_at_start) < ANSWER
            for n in range(count):  # the client reads at last: every answer, in order
                answer = await peer.answer()
                assert (answer.status, answer.headers["X-Path"]) == (200, f"/{n}")
            assert len(buffered_at_start) == count

    run(scenario)


def test_at_most_one_request_is_parsed_ahead_and_the_rest_waits_unparsed(run: Run) -> None:
    async def scenario() -> None:
        release = asyncio.Event()
        first_started = asyncio.Event()
        body = b"b" * 60_000

        async def handler(request: DownstreamRequest) -> Reply:
            read = await request.read()
            if request.path == "/0":
                first_started.set()
                await release.wait()
            return DownstreamResponse(body=read[:10], headers={"X-Path": request.path})

        async with serving(handler) as served:
            peer = await served.connect()
            await peer.send(b"".join(post(f"/{n}", body) for n in range(6)))
            assert await happens(first_started)
            conn = only_connection(served)
            # One request waits its turn; what follows it waits as bytes (at most one read),
            # not as parsed requests with their bodies.
            assert len(conn._queue) <= 1
            assert served.server.buffered <= len(body) + READ_SIZE
            release.set()
            for n in range(6):
                answer = await peer.answer()
                assert (answer.status, answer.headers["X-Path"]) == (200, f"/{n}")
                assert answer.body == b"b" * 10
            assert served.server.buffered == 0  # every byte held was let go

    run(scenario)


def test_a_long_pipeline_answered_at_once_is_answered_in_order(run: Run) -> None:
    # Answers that need no wait start one after another; thousands must not nest.
    async def scenario() -> None:
        async def handler(request: DownstreamRequest) -> Reply:
            return DownstreamResponse(headers={"X-Path": request.path})

        count = 3000
        async with serving(handler) as served:
            peer = await served.connect()
            await peer.send(b"".join(get(f"/{n}") for n in range(count)))
            for n in range(count):
                answer = await peer.answer()
                assert (answer.status, answer.headers["X-Path"]) == (200, f"/{n}")

    run(scenario)


def test_a_pipelined_request_waiting_its_turn_is_not_timed_out(run: Run) -> None:
    # Its bytes are held back by the server, not late from the client: no 408 for it.
    async def scenario() -> None:
        release = asyncio.Event()

        async def handler(request: DownstreamRequest) -> Reply:
            read = await request.read()
            if request.path == "/slow":
                await release.wait()
            return DownstreamResponse(body=read)

        async with serving(handler, read_timeout_s=0.2) as served:
            peer = await served.connect()
            await peer.send(post("/slow", b"1") + post("/next", b"2" * 1000))
            # A witness whose head never ends is refused once the read timeout has passed
            # on the server's clock: by then a timer on the waiting request would have fired.
            witness = await served.connect()
            await witness.send(b"GET / HTTP/1.1\r\nHost: t\r\n")
            assert (await witness.answer()).status == 408
            release.set()
            assert (await peer.answer()).body == b"1"
            assert (await peer.answer()).body == b"2" * 1000

    run(scenario)


# --- memory budget and connection limit ----------------------------------------------------------


def test_a_body_that_would_pass_the_process_budget_is_503_and_the_budget_comes_back(
    run: Run,
) -> None:
    async def scenario() -> None:
        async def handler(request: DownstreamRequest) -> Reply:
            try:
                body = await request.read()
            except Refused as exc:
                return DownstreamResponse(status=exc.status, body=exc.reason.encode())
            return DownstreamResponse(body=b"%d" % len(body))

        async with serving(handler, max_buffered_bytes=100_000) as served:
            holder = await served.connect()
            # A slow sender holds 80,000 of the 100,000 bytes.
            await holder.send(request_head("POST", b"Content-Length: 90000") + b"h" * 80_000)
            await until(lambda: served.server.buffered >= 80_000)
            other = await served.connect()
            await other.send(post("/", b"o" * 30_000))
            refused = await other.answer()
            assert refused.status == 503
            assert refused.body.startswith(b"Service unavailable")
            await holder.send(b"h" * 10_000)
            assert (await holder.answer()).body == b"90000"
            assert served.server.buffered == 0
            later = await served.connect()
            await later.send(post("/", b"l" * 30_000))
            assert (await later.answer()).body == b"30000"

    run(scenario)


def test_connections_past_the_limit_get_503_and_are_closed(run: Run) -> None:
    async def scenario() -> None:
        async with serving(max_connections=2) as served:
            first = await served.connect()
            second = await served.connect()
            await until(lambda: len(served.server.connections) == 2)
            third = await served.connect()
            answer = await third.answer()
            assert (answer.status, answer.closes) == (503, True)
            assert answer.headers["Retry-After"] == "1"
            assert b"2 connections" in answer.body
            await third.closed()
            await first.send(post("/", b"one"))
            assert (await first.answer()).body == b"one"
            await first.close()
            await until(lambda: len(served.server.connections) == 1)
            fourth = await served.connect()
            await fourth.send(post("/", b"four"))
            assert (await fourth.answer()).body == b"four"
            await second.send(post("/", b"two"))
            assert (await second.answer()).body == b"two"

    run(scenario)


def test_a_connection_closes_after_its_maximum_of_requests(run: Run) -> None:
    async def scenario() -> None:
        paths: list[str] = []

        async def handler(request: DownstreamRequest) -> Reply:
            paths.append(request.path)
            return await echo(request)

        async with serving(handler, max_requests_per_connection=2) as served:
            peer = await served.connect()
            await peer.send(get("/1") + get("/2") + get("/3"))
            first = await peer.answer()
            second = await peer.answer()
            assert (first.closes, second.closes) == (False, True)
            await peer.closed()
        assert paths == ["/1", "/2"]

    run(scenario)


# --- the head ------------------------------------------------------------------------------------


@pytest.mark.parametrize("trickled", [False, True], ids=["whole", "trickled"])
def test_a_head_over_its_bound_is_431_though_each_line_fits(run: Run, trickled: bool) -> None:
    async def scenario() -> None:
        async with serving(max_header_bytes=1000, max_headers=50, max_head_bytes=4000) as served:
            peer = await served.connect()
            lines = [b"X-%d: " % n + b"v" * 900 for n in range(5)]  # 4.5 KB in 5 lines
            wire = request_head("GET", *lines)
            if trickled:
                for line in wire.split(b"\r\n"):
                    await peer.send(line + b"\r\n")
            else:
                await peer.send(wire)
            answer = await peer.answer()
            assert (answer.status, answer.closes) == (431, True)
            await peer.closed()

    run(scenario)


def test_a_head_at_its_bound_is_served(run: Run) -> None:
    async def scenario() -> None:
        async with serving(max_header_bytes=1000, max_headers=50, max_head_bytes=4000) as served:
            peer = await served.connect()
            await peer.send(request_head("GET", *(b"X-%d: " % n + b"v" * 900 for n in range(4))))
            assert (await peer.answer()).status == 200

    run(scenario)


# --- RFC 9112 framing ---------------------------------------------------------------------------

FAULTY = {
    # 6.1: Transfer-Encoding in HTTP/1.0 is faulty framing, whatever comes with it.
    "http10-chunked-keep-alive": b"POST /x HTTP/1.0\r\nHost: t\r\nConnection: keep-alive\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    # 3.2: an HTTP/1.1 request without Host, with two, or with one that names no host.
    "no-host": b"GET /x HTTP/1.1\r\nX-A: a\r\n\r\n",
    "two-hosts": b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n",
    "two-hosts-http10": b"GET /x HTTP/1.0\r\nHost: a\r\nHost: b\r\nConnection: keep-alive\r\n\r\n",
    "host-with-a-path": b"GET /x HTTP/1.1\r\nHost: evil.example/x\r\n\r\n",
    "host-with-userinfo": b"GET /x HTTP/1.1\r\nHost: user@evil.example\r\n\r\n",
    "host-with-a-space": b"GET /x HTTP/1.1\r\nHost: a b\r\n\r\n",
}


@pytest.mark.parametrize("wire", FAULTY.values(), ids=FAULTY.keys())
def test_faulty_framing_is_400_and_the_end_of_the_connection_and_nothing_is_served(
    run: Run, wire: bytes
) -> None:
    async def scenario() -> None:
        paths: list[str] = []

        async def handler(request: DownstreamRequest) -> Reply:
            paths.append(request.path)
            return await echo(request)

        async with serving(handler) as served:
            peer = await served.connect()
            await peer.send(wire + get("/smuggled"))
            answer = await peer.answer()
            assert (answer.status, answer.closes) == (400, True), answer
            assert answer.body.startswith(b"refused: Bad request")
            await peer.closed()
        assert paths == []

    run(scenario)


@pytest.mark.parametrize(
    "host", [b"", b"example.com", b"127.0.0.1:8080", b"[::1]:8080", b"xn--e1a.example"]
)
def test_well_formed_hosts_are_served(run: Run, host: bytes) -> None:
    async def scenario() -> None:
        async with serving() as served:
            peer = await served.connect()
            await peer.send(b"GET /ok HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
            answer = await peer.answer()
            assert (answer.status, answer.headers["X-Path"]) == (200, "/ok")

    run(scenario)


def test_an_http10_request_without_host_is_served(run: Run) -> None:
    async def scenario() -> None:
        async with serving() as served:
            peer = await served.connect()
            await peer.send(b"GET /old HTTP/1.0\r\n\r\n")
            answer = await peer.answer()
            assert (answer.status, answer.closes) == (200, True)

    run(scenario)


def test_a_pipelined_request_after_faulty_framing_is_never_served(run: Run) -> None:
    # The answer before the faulty request is sent; the faulty one and all after it are not.
    async def scenario() -> None:
        paths: list[str] = []

        async def handler(request: DownstreamRequest) -> Reply:
            paths.append(request.path)
            return await echo(request)

        async with serving(handler) as served:
            peer = await served.connect()
            await peer.send(get("/first") + FAULTY["two-hosts"] + get("/smuggled"))
            first = await peer.answer()
            assert (first.status, first.headers["X-Path"], first.closes) == (200, "/first", True)
            await peer.closed()
        assert paths == ["/first"]

    run(scenario)


# --- what is written -----------------------------------------------------------------------------

UNSAFE = {
    "crlf-in-a-value": {"X-A": "v\r\nX-Injected: 1"},
    "lf-in-a-value": {"X-A": "v\nX-Injected: 1"},
    "cr-in-a-value": {"X-A": "v\rX-Injected: 1"},
    "nul-in-a-value": {"X-A": "v\0"},
    "crlf-in-a-name": {"X-A\r\nX-Injected": "1"},
    "not-latin-1": {"X-A": "\u2603"},
}


@pytest.mark.parametrize("headers", UNSAFE.values(), ids=UNSAFE.keys())
@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
def test_a_header_with_cr_lf_or_nul_is_never_written(
    run: Run, headers: dict[str, str], streamed: bool
) -> None:
    async def scenario() -> None:
        async def handler(request: DownstreamRequest) -> Reply:
            if request.path != "/":
                return await echo(request)
            if streamed:
                return request.stream(200, headers)
            return DownstreamResponse(body=b"secret", headers=headers)

        async with serving(handler) as served:
            peer = await served.connect()
            await peer.send(get("/"))
            answer = await peer.answer()
            assert (answer.status, answer.body) == (500, b"refused: Internal error")
            assert b"Injected" not in answer.head
            assert b"\0" not in answer.head
            # Nothing of the refused answer went out: the connection goes on, framed.
            await peer.send(post("/next", b"next"))
            assert (await peer.answer()).body == b"next"

    run(scenario)


# --- drain ---------------------------------------------------------------------------------------


def test_a_body_still_arriving_when_the_drain_begins_is_read_and_answered(run: Run) -> None:
    async def scenario() -> None:
        reading = asyncio.Event()

        async def handler(request: DownstreamRequest) -> Reply:
            reading.set()
            return await echo(request)

        async with serving(handler) as served:
            peer = await served.connect()
            await peer.send(request_head("POST", b"Content-Length: 10") + b"12345")
            assert await happens(reading)
            drain = asyncio.create_task(served.server.shutdown(5))
            await until(lambda: served.server.draining)
            await peer.send(b"67890")
            answer = await peer.answer()
            assert (answer.status, answer.body, answer.closes) == (200, b"1234567890", True)
            async with asyncio.timeout(SOON):
                await drain

    run(scenario)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
def test_an_answer_with_many_safe_headers_is_written_whole(run: Run, streamed: bool) -> None:
    async def scenario() -> None:
        headers = {f"X-{n}": f"value {n}" for n in range(6)}

        async def handler(request: DownstreamRequest) -> Reply:
            if streamed:
                return request.stream(200, headers)
            return DownstreamResponse(body=b"ok", headers=headers)

        async with serving(handler) as served:
            peer = await served.connect()
            await peer.send(get("/"))
            answer = await peer.answer()
            assert answer.status == 200
            assert {name: answer.headers[name] for name in headers} == headers

    run(scenario)


def test_a_connection_closed_on_a_client_that_never_reads_is_cut_after_the_idle_timeout(
    run: Run,
) -> None:
    # A transport flushes before it closes; unread, its answer would stay in memory for good.
    async def scenario() -> None:
        async def handler(request: DownstreamRequest) -> Reply:
            return DownstreamResponse(body=b"x" * (32 * 1024 * 1024))

        async with serving(handler, keepalive_timeout_s=0.3) as served:
            peer = await served.connect()
            await peer.send(get("/", b"Connection: close"))
            await until(lambda: bool(served.server.connections))
            await served.forgets_all()  # not waiting for the client to read 32 MiB

    run(scenario)


def test_bytes_dropped_over_the_budget_are_never_spliced_onto_a_request(run: Run) -> None:
    # Found by the fuzzer: the waiting bytes (B's body, C's start) did not fit the budget and
    # were dropped, and the next read's bytes were then parsed as B's body (it read b"C").
    async def scenario() -> None:
        bodies: list[bytes] = []

        async def handler(request: DownstreamRequest) -> Reply:
            try:
                body = await request.read()
            except Refused as exc:
                return DownstreamResponse(status=exc.status, body=exc.reason.encode())
            bodies.append(body)
            return DownstreamResponse(body=body)

        async with serving(handler, max_buffered_bytes=512) as served:
            peer = await served.connect()
            third = post("/c", b"C" * 600)
            await peer.send(post("/a", b"A") + post("/b", b"B") + third[:560])
            first = await peer.answer()
            assert (first.status, first.body) == (200, b"A")
            await peer.send(third[560:] + post("/evil", b"EVIL"))
            second = await peer.answer()
            assert (second.status, second.body) in ((200, b"B"), (503, OVER_BUDGET.encode()))
            await peer.rest()  # whatever follows, the connection ends
        assert set(bodies) <= {b"A", b"B", b"C" * 600}

    run(scenario)
