"""The answer budget (gateway/h1/answers.py) on real loopback sockets, under asyncio's loop and
uvloop: clients that ask for large answers and never read them make taskgate hold at most the
bound the budget documents, a client that reads is answered meanwhile, an answer that must wait
goes on once bytes are let go (or ends as a timeout at its deadline), and when the clients leave
nothing stays counted.

The public listener's server, the relay and the pool are taskgate's own; the replica is a raw
asyncio server that answers each JSON-RPC request with a result of the size it asks for. Socket
buffers are kept small (the listening socket's send buffer, which accepted sockets inherit, and
the clients' receive buffers), so that what a client does not read stays in taskgate's memory
rather than in the kernel's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.errors import GatewayError
from gateway.h1.answers import AnswerBudget
from gateway.h1.limits import READ_SIZE, Limits
from gateway.h1.request import DownstreamRequest, DownstreamResponse, Reply
from gateway.h1.server import Server
from gateway.protocol.envelope import RPCRequest, parse
from gateway.upstream.backlog import HIGH_WATER
from gateway.upstream.pool import Pool
from gateway.upstream.relay import forward
from gateway.upstream.replicas import Replica
from tests.listener.conftest import Run
from tests.listener.test_h1_server import WAIT, Peer, refusal, until

KIB = 1024
MIB = 1024 * KIB
LIMIT = 4 * MIB
MAX_CONNECTIONS = 64  # a reserve of LIMIT / 64 = 64 KiB per connection
ANSWER = 2 * MIB  # what each client that never reads asks for
NON_READERS = 20
SMALL = 200
# One answer's JSON-RPC framing around its padding, with room.
FRAMING = 1024
_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")


def bound(readers: int) -> int:
    """What the budget lets taskgate hold (gateway/h1/answers.py, docs/operations.md): twice the
    limit, one answer read beyond it, and per request reading, the read that crossed the line
    (at most the upstream read-ahead and one read)."""
    return 2 * LIMIT + ANSWER + FRAMING + readers * (HIGH_WATER + READ_SIZE)


class AnsweringReplica:
    """Answers each request, on a kept-alive connection, with a result padded to `size`: a JSON
    body, or with `"stream": true` an event stream of that one message; with `"together": n`,
    once n requests have come."""

    def __init__(self) -> None:
        self.requests = 0
        self.server: asyncio.Server | None = None
        self._serving: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._arrived = asyncio.Condition()

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/mcp"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._serving[task] = writer
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                found = _LENGTH.search(head)
                assert found is not None, head
                message = orjson.loads(await reader.readexactly(int(found.group(1))))
                async with self._arrived:
                    self.requests += 1
                    self._arrived.notify_all()
                    together = message["params"].get("together", 0)
                    await self._arrived.wait_for(functools.partial(self._came, together))
                pad = b"x" * message["params"]["size"]
                body = b'{"jsonrpc":"2.0","id":%d,"result":{"pad":"%s"}}' % (message["id"], pad)
                kind = b"application/json"
                if message["params"].get("stream"):
                    body, kind = b"data: %s\n\n" % body, b"text/event-stream"
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (kind, len(body), body)
                )
                await writer.drain()  # waits while taskgate does not read
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.transport.abort()
            self._serving.pop(task, None)

    def _came(self, count: int) -> bool:
        return self.requests >= count

    async def stop(self) -> None:
        """Close every connection (a write waiting for taskgate fails) and wait for the
        handlers to end, then the server."""
        for writer in list(self._serving.values()):
            writer.transport.abort()
        await asyncio.gather(*self._serving, return_exceptions=True)
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


@dataclass
class Gateway:
    """The server, its pool and budget, and what the handler saw."""

    server: Server
    pool: Pool
    budget: AnswerBudget
    port: int
    answered: int = 0
    sockets: list[socket.socket] = field(default_factory=list)

    def unsent(self) -> int:
        """What the transports of the server's connections hold unsent, now."""
        total = 0
        for conn in self.server.connections:
            transport = conn._transport
            if transport is not None:
                total += transport.get_write_buffer_size()
        return total

    def counted_unsent(self) -> int:
        return sum(
            conn._account.unsent for conn in self.server.connections if conn._account is not None
        )

    async def never_reads(self, size: int, *, stream: bool = False) -> socket.socket:
        """A client with a small receive buffer that asks for `size` bytes and never reads."""
        sock = _small_client_socket()
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, ("127.0.0.1", self.port))
        await loop.sock_sendall(sock, call(len(self.sockets) + 1, size, stream=stream))
        self.sockets.append(sock)
        return sock

    async def reader(self) -> Peer:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        return Peer(reader, writer)


def call(
    request_id: int,
    size: int,
    timeout_s: float = 30.0,
    *,
    stream: bool = False,
    together: int = 0,
) -> bytes:
    params = {
        "name": "pad",
        "size": size,
        "timeout_s": timeout_s,
        "stream": stream,
        "together": together,
    }
    body = orjson.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    )
    return (
        b"POST /mcp HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )


def _small_client_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * KIB)
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def gateway(*, small_buffers: bool = True) -> AsyncIterator[Gateway]:
    replica = AnsweringReplica()
    replica.server = await asyncio.start_server(replica.serve, "127.0.0.1", 0)
    budget = AnswerBudget(LIMIT, MAX_CONNECTIONS)
    pool = Pool(connect_timeout_s=3, answers=budget)
    upstream = Replica("pad", replica.url, max_answer_bytes=ANSWER + FRAMING)
    state: list[Gateway] = []

    async def inspect(message: Any) -> None:
        """Makes the relay decode an event stream event by event, as capture does."""

    async def handler(request: DownstreamRequest) -> Reply:
        message = parse(await request.read())
        assert isinstance(message, RPCRequest)
        timeout_s = float(message.params["timeout_s"])
        headers = b"Content-Type: application/json\r\n"
        try:
            reply = await forward(
                pool, upstream, message, headers, timeout_s, request, inspect=inspect
            )
        except GatewayError as failed:
            reply = DownstreamResponse(failed.status, failed.body(), "application/json")
        state[0].answered += 1
        return reply

    server = Server(handler, Limits(max_connections=MAX_CONNECTIONS), refusal)
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if small_buffers:
        # Inherited by accepted sockets: the kernel takes little of what a client does not
        # read (and what a client reads comes slowly).
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * KIB)
    listening.bind(("127.0.0.1", 0))
    listener = await asyncio.get_running_loop().create_server(server, sock=listening)
    served = Gateway(server, pool, budget, listening.getsockname()[1])
    state.append(served)
    try:
        yield served
    finally:
        listener.close()
        for sock in served.sockets:
            sock.close()
        await server.shutdown(0)
        await pool.close()
        await listener.wait_closed()
        await replica.stop()


async def settled(gw: Gateway, count: int) -> None:
    """Every one of `count` requests was answered, waits for the budget or waits for its client
    to read a stream, and the bound held at every look (a bounded poll: a paused read signals
    nothing a test could await)."""

    def check() -> bool:
        assert gw.budget.held <= bound(count), (gw.budget.held, bound(count))
        draining = sum(1 for conn in gw.server.connections if conn._drained is not None)
        return gw.answered + gw.budget.waiting + draining >= count

    await until(check)


# --- clients that never read -----------------------------------------------------------------


def test_clients_that_never_read_hold_at_most_the_bound_and_a_reader_is_answered(run: Run) -> None:
    async def scenario() -> None:
        async with gateway() as gw:
            for _ in range(NON_READERS):
                await gw.never_reads(ANSWER)
            await settled(gw, NON_READERS)
            # Unbounded, taskgate would hold 20 answers of 2 MiB: all but what the kernel took.
            held = gw.budget.held
            assert held <= bound(NON_READERS), held
            assert gw.budget.waiting > 0  # the budget, not the clients, stopped the reading
            # What the transports really hold is what was counted (looked at after each write).
            assert gw.unsent() <= gw.counted_unsent() <= held
            assert gw.unsent() <= bound(NON_READERS)
            # A client that reads, on a connection of its own, is answered meanwhile.
            peer = await gw.reader()
            await peer.send(call(1000, SMALL))
            answer = await peer.answer()
            assert answer.status == 200
            assert len(orjson.loads(answer.body)["result"]["pad"]) == SMALL
            await peer.close()
            # The clients leave: nothing stays counted, and no read waits.
            for sock in gw.sockets:
                sock.close()
            await until(lambda: len(gw.server.connections) == 0)
            await until(lambda: gw.budget.held == 0 and gw.budget.waiting == 0)
            assert gw.budget.beyond is None

    run(scenario)


def test_event_streams_never_read_hold_at_most_the_bound_events_being_decoded_included(
    run: Run,
) -> None:
    # Each stream is one event of 2 MiB, decoded whole before it is relayed (as capture
    # inspects every event): the event counts while it is decoded, and once written.
    async def scenario() -> None:
        async with gateway() as gw:
            for _ in range(NON_READERS):
                await gw.never_reads(ANSWER, stream=True)
            await settled(gw, NON_READERS)
            assert gw.budget.waiting > 0
            assert gw.unsent() <= gw.counted_unsent() <= gw.budget.held <= bound(NON_READERS)
            for sock in gw.sockets:
                sock.close()
            await until(lambda: len(gw.server.connections) == 0)
            await until(lambda: gw.budget.held == 0 and gw.budget.waiting == 0)

    run(scenario)


def test_an_answer_that_waits_for_the_budget_goes_on_when_the_clients_that_never_read_leave(
    run: Run,
) -> None:
    async def scenario() -> None:
        async with gateway() as gw:
            for _ in range(NON_READERS):
                await gw.never_reads(ANSWER)
            await settled(gw, NON_READERS)
            # A large answer for a client that reads: past the limit, beyond its reserve, and
            # the one read allowed beyond it is taken. It waits.
            peer = await gw.reader()
            waiting = gw.budget.waiting
            await peer.send(call(1000, ANSWER))
            await until(lambda: gw.budget.waiting > waiting)
            answer = asyncio.ensure_future(peer.answer())
            for sock in gw.sockets:
                sock.close()
            # Their bytes are let go, and the waiting answer is read and relayed whole.
            async with asyncio.timeout(WAIT):
                got = await answer
            assert got.status == 200
            assert len(orjson.loads(got.body)["result"]["pad"]) == ANSWER
            await peer.close()
            await until(lambda: gw.budget.held == 0 and gw.budget.waiting == 0)

    run(scenario)


def test_an_answer_that_waits_past_its_deadline_ends_as_a_timeout(run: Run) -> None:
    async def scenario() -> None:
        async with gateway() as gw:
            for _ in range(NON_READERS):
                await gw.never_reads(ANSWER)
            await settled(gw, NON_READERS)
            peer = await gw.reader()
            await peer.send(call(1000, ANSWER, timeout_s=0.5))
            answer = await peer.answer()
            # The answer a replica too slow to answer gets (504: a tool call may have run).
            assert answer.status == 504
            assert orjson.loads(answer.body)["error"]["code"] == -32603
            # Its bytes are let go with it; the clients that never read still hold theirs.
            assert gw.budget.held <= bound(NON_READERS)
            await peer.close()
            for sock in gw.sockets:
                sock.close()
            await until(lambda: gw.budget.held == 0 and gw.budget.waiting == 0)

    run(scenario)


def test_answers_read_whole_at_once_past_the_limit_all_complete(run: Run) -> None:
    # Clients that read, each asking for a large answer, sent by the replica at once: together
    # past the limit. Were every read beyond its reserve paused, none would finish, and each
    # would wait for the others until its deadline; one at a time goes on, then the next.
    async def scenario() -> None:
        async with gateway(small_buffers=False) as gw:
            peers = [await gw.reader() for _ in range(12)]
            for n, peer in enumerate(peers):
                await peer.send(call(n + 1, ANSWER, together=len(peers)))
            answers = await asyncio.gather(*(peer.answer() for peer in peers))
            assert [a.status for a in answers] == [200] * len(peers)
            for got in answers:
                assert len(orjson.loads(got.body)["result"]["pad"]) == ANSWER
            for peer in peers:
                await peer.close()
            await until(lambda: gw.budget.held == 0 and gw.budget.waiting == 0)

    run(scenario)


def test_a_server_given_the_budget_counts_its_own_answers_too(run: Run) -> None:
    # Answers the handler makes itself (taskgate's lists, its refusals) are not read from a
    # replica; with the budget, they count once written and are let go with the connection.
    async def scenario() -> None:
        budget = AnswerBudget(LIMIT, MAX_CONNECTIONS)

        async def handler(request: DownstreamRequest) -> Reply:
            return DownstreamResponse(body=b"o" * ANSWER, content_type="application/json")

        server = Server(handler, Limits(max_connections=MAX_CONNECTIONS), refusal, budget)
        listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * KIB)
        listening.bind(("127.0.0.1", 0))
        loop = asyncio.get_running_loop()
        listener = await loop.create_server(server, sock=listening)
        sock = _small_client_socket()
        try:
            await loop.sock_connect(sock, listening.getsockname())
            await loop.sock_sendall(sock, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            await until(lambda: budget.held > ANSWER // 2)
            (conn,) = server.connections
            assert conn._transport is not None
            assert conn._transport.get_write_buffer_size() <= budget.held
            sock.close()
            await until(lambda: not server.connections)
            assert budget.held == 0
        finally:
            sock.close()
            listener.close()
            await server.shutdown(0)
            await listener.wait_closed()

    run(scenario)
