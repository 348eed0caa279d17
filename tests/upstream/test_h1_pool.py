"""The relay's HTTP/1.1 client against real loopback servers, under asyncio's loop and uvloop.

Each scenario starts its own server: aiohttp's for well-behaved answers, a scripted asyncio
server for what a broken or slow replica does on the wire. Every scenario runs under both event
loops because taskgate serves on uvloop while in-process tests run on asyncio's, and the two
differ in ways a protocol class can trip on (uvloop's transports are not asyncio.Transport).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway.upstream.backlog import HIGH_WATER
from gateway.upstream.connection import UpstreamResponse
from gateway.upstream.framing import (
    Broken,
    ConnectFailed,
    DeadlineExceeded,
    HeadLimits,
    HeadTooLarge,
    Malformed,
    TooLarge,
)
from gateway.upstream.pool import Origin, Pool

Scenario = Callable[[], Coroutine[Any, Any, None]]
Reader = asyncio.StreamReader
Writer = asyncio.StreamWriter
HEADERS = b"Content-Type: application/json\r\n"
LIMIT = 64 * 1024 * 1024


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Scenario], None]:
    def runner(scenario: Scenario) -> None:
        if request.param == "uvloop":
            uvloop.run(asyncio.wait_for(scenario(), 20))
        else:
            asyncio.run(asyncio.wait_for(scenario(), 20))

    return runner


def deadline(seconds: float = 5.0) -> float:
    return asyncio.get_running_loop().time() + seconds


@contextlib.asynccontextmanager
async def aiohttp_server(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        await runner.cleanup()


class Scripted:
    """A TCP server whose every connection runs `script(reader, writer, n)` (n counts from 0);
    it records how many connections it accepted and which of them the client closed."""

    def __init__(
        self, script: Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
    ) -> None:
        self.script = script
        self.accepted = 0
        self.client_closed = asyncio.Event()
        self.handlers: list[asyncio.Task[Any]] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/mcp"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def settled(self) -> None:
        """Every connection's script has run to its end (bounded)."""
        async with asyncio.timeout(10):
            await asyncio.gather(*self.handlers)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = self.accepted
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self.handlers.append(task)
        try:
            await self.script(reader, writer, n)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and body (by Content-Length), as the replica receives them."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head, await reader.readexactly(length)


async def wait_for_close(reader: asyncio.StreamReader) -> bool:
    """True when the client closed the connection within 5 s, False if it kept it open."""
    try:
        async with asyncio.timeout(5):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


def replying(wire: Callable[[int], bytes]) -> Scripted:
    """A replica that answers one request per connection n with `wire(n)`, then waits for
    the client to close the connection."""

    async def script(reader: Reader, writer: Writer, n: int) -> None:
        await read_request(reader)
        writer.write(wire(n))
        await writer.drain()
        await wait_for_close(reader)

    return Scripted(script)


async def post(pool: Pool, url: str, *, idempotent: bool = False) -> UpstreamResponse:
    return await pool.post(url, HEADERS, b"{}", deadline=deadline(), idempotent=idempotent)


def answer(body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    head += b"".join(line + b"\r\n" for line in extra)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


# --- well-behaved replicas ----------------------------------------------------------------


def test_json_answers_reuse_one_connection(run: Callable[[Scenario], None]) -> None:
    async def scenario() -> None:
        peers: set[object] = set()

        async def echo(request: web.Request) -> web.Response:
            peers.add(request.transport.get_extra_info("peername") if request.transport else None)
            return web.json_response({"got": (await request.read()).decode()})

        app = web.Application()
        app.router.add_post("/mcp", echo)
        async with aiohttp_server(app) as url:
            pool = Pool(connect_timeout_s=3)
            for n in range(5):
                body = b'{"n":%d}' % n
                response = await pool.post(
                    url, HEADERS, body, deadline=deadline(), idempotent=False
                )
                assert response.status == 200
                assert response.header(b"content-type") == "application/json; charset=utf-8"
                assert await response.read(LIMIT) == b'{"got": "{\\"n\\":%d}"}' % n
            await pool.close()
        assert len(peers) == 1  # five exchanges, one connection

    run(scenario)


def test_limits_set_again_with_the_same_values_keep_the_idle_connection(
    run: Callable[[Scenario], None],
) -> None:
    """The idle connections are keyed by origin, limits included, compared by value: a reload
    that sets a replica's limits again to the same values finds its connections (none left
    idle for good), while other limits mean other connections."""

    async def scenario() -> None:
        peers: list[object] = []

        async def echo(request: web.Request) -> web.Response:
            peers.append(
                request.transport.get_extra_info("peername") if request.transport else None
            )
            return web.json_response({})

        app = web.Application()
        app.router.add_post("/mcp", echo)
        async with aiohttp_server(app) as url:
            pool = Pool(connect_timeout_s=3)
            for limits in (None, HeadLimits(), HeadLimits(), HeadLimits(max_headers=50)):
                if limits is not None:
                    pool.limit(url, limits)
                response = await post(pool, url)
                assert await response.read(LIMIT) == b"{}"
            await pool.close()
        # The default limits, then the same values twice: one connection; other limits: another.
        assert peers[0] == peers[1] == peers[2]
        assert peers[3] != peers[0]

    run(scenario)


def test_the_request_carries_path_host_headers_and_length(
    run: Callable[[Scenario], None],
) -> None:
    async def scenario() -> None:
        seen: list[bytes] = []

        async def script(reader: Reader, writer: Writer, n: int) -> None:
            head, body = await read_request(reader)
            seen.extend((head, body))
            writer.write(answer(b"{}"))
            await writer.drain()

        async with Scripted(script) as url:
            pool = Pool(connect_timeout_s=3)
            response = await pool.post(
                url,
                b"Mcp-Method: tools/call\r\n",
                b'{"a":1}',
                deadline=deadline(),
                idempotent=False,
            )
            await response.read(LIMIT)
            await pool.close()
        port = url.split(":")[2].split("/")[0]
        assert seen[0] == (
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%s\r\nMcp-Method: tools/call\r\n"
            b"Content-Length: 7\r\n\r\n" % port.encode()
        )
        assert seen[1] == b'{"a":1}'

    run(scenario)


def test_the_request_target_is_encoded_and_host_has_no_userinfo() -> None:
    origin = Origin.of("http://u:p@[::1]:8080/a b/ü/mcp")
    assert origin.prefix == b"POST /a%20b/%C3%BC/mcp HTTP/1.1\r\nHost: [::1]:8080\r\n"
    assert (origin.host, origin.port, origin.tls) == ("::1", 8080, False)
    assert Origin.of("https://h").prefix == b"POST / HTTP/1.1\r\nHost: h\r\n"
    assert Origin.of("https://h").port == 443


def test_a_deadline_inside_a_body_without_framing_is_not_taken_for_its_end(
    run: Callable[[Scenario], None],
) -> None:
    async def scenario() -> None:
        # No Content-Length, no chunks: only the replica closing would end this body.
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
        server = replying(lambda n: head + b'{"partial":')
        async with server as url:
            pool = Pool(connect_timeout_s=3)
            response = await pool.post(
                url, HEADERS, b"{}", deadline=deadline(0.2), idempotent=False
            )
            # Nobody reads until the deadline has closed the connection (the replica saw it):
            # taskgate's own close must not pass for the replica ending the body.
            await server.settled()
            with pytest.raises(DeadlineExceeded):
                await response.read(LIMIT)
            await pool.close()

    run(scenario)


def test_chunked_and_close_delimited_bodies_are_read_whole(
    run: Callable[[Scenario], None],
) -> None:
    async def scenario() -> None:
        async def script(reader: Reader, writer: Writer, n: int) -> None:
            await read_request(reader)
            if n == 0:
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b'Transfer-Encoding: chunked\r\n\r\n3\r\n{"a\r\n4\r\n":1}\r\n0\r\n\r\n'
                )
                await writer.drain()
                await read_request(reader)  # the next request, on the same connection
            # no framing: the body ends when the replica closes the connection
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"b":2}')
            await writer.drain()

        server = Scripted(script)
        async with server as url:
            pool = Pool(connect_timeout_s=3)
            answers = []
            for _ in range(3):
                response = await pool.post(
                    url, HEADERS, b"{}", deadline=deadline(), idempotent=False
                )
                answers.append(await response.read(LIMIT))
            await pool.close()
        assert answers == [b'{"a":1}', b'{"b":2}', b'{"b":2}']
        # a close-delimited answer leaves nothing to reuse: the third needed a new connection
        assert server.accepted == 2

    run(scenario)


def test_an_event_stream_arrives_in_order_and_holds_back_a_fast_replica(
    run: Callable[[Scenario], None],
) -> None:
    async def scenario() -> None:
        # 32 MB: far more than the loopback socket buffers and HIGH_WATER together hold, so
        # the replica cannot have written it all while taskgate's consumer holds still.
        events = [b"data: %d %s\n\n" % (n, b"x" * 16_000) for n in range(2_000)]
        written = asyncio.Event()

        async def stream(request: web.Request) -> web.StreamResponse:
            await request.read()
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for event in events:
                await response.write(event)
            await response.write_eof()
            written.set()
            return response

        app = web.Application()
        app.router.add_post("/mcp", stream)
        async with aiohttp_server(app) as url:
            pool = Pool(connect_timeout_s=3)
            response = await pool.post(url, HEADERS, b"{}", deadline=deadline(), idempotent=False)
            chunks = response.chunks()
            first = await anext(chunks)
            async with asyncio.timeout(10):
                while True:  # a bounded wait for the buffer to fill; the interval polls
                    if response.buffered >= HIGH_WATER:
                        break
                    await asyncio.sleep(0.005)
            # Reading stopped there: memory stays near the mark and the replica is held back.
            assert response.buffered < HIGH_WATER + 1024 * 1024
            assert not written.is_set()
            received = first + b"".join([chunk async for chunk in chunks])
            assert received == b"".join(events)
            again = await pool.post(url, HEADERS, b"{}", deadline=deadline(), idempotent=False)
            assert len(await again.read(LIMIT)) == len(received)
            await pool.close()

    run(scenario)


# --- failures -----------------------------------------------------------------------------


def test_a_refused_connection_is_unreachable(run: Callable[[Scenario], None]) -> None:
    async def scenario() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        pool = Pool(connect_timeout_s=3)
        with pytest.raises(ConnectFailed):
            await pool.post(
                f"http://127.0.0.1:{port}/mcp",
                HEADERS,
                b"{}",
                deadline=deadline(),
                idempotent=False,
            )
        await pool.close()

    run(scenario)


def test_the_deadline_covers_the_answer_and_closes_the_connection(
    run: Callable[[Scenario], None],
) -> None:
    async def scenario() -> None:
        closed: list[bool] = []

        async def script(reader: Reader, writer: Writer, n: int) -> None:
            await read_request(reader)
            if n == 1:  # the head, then a body that never comes
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                writer.write(b"Content-Length: 10\r\n\r\n{")
                await writer.drain()
            closed.append(await wait_for_close(reader))

        server = Scripted(script)
        async with server as url:
            pool = Pool(connect_timeout_s=3)
            with pytest.raises(DeadlineExceeded):
                await pool.post(url, HEADERS, b"{}", deadline=deadline(0.2), idempotent=False)
            response = await pool.post(
                url, HEADERS, b"{}", deadline=deadline(0.2), idempotent=False
            )
            with pytest.raises(DeadlineExceeded):
                await response.read(LIMIT)
            await server.settled()
            await pool.close()
        assert closed == [True, True]  # each replica saw its connection closed

    run(scenario)


@pytest.mark.parametrize(("first_s", "second_s"), [(0.1, 0.6), (5.0, 0.2)], ids=["later", "sooner"])
def test_each_exchange_on_a_reused_connection_keeps_its_own_deadline(
    run: Callable[[Scenario], None], first_s: float, second_s: float
) -> None:
    """One timer serves a connection's exchanges (gateway/upstream/connection.py): armed for
    the first, it must neither cut the second at the first's deadline nor let a sooner one
    pass by."""

    async def scenario() -> None:
        async def script(reader: Reader, writer: Writer, n: int) -> None:
            await read_request(reader)
            writer.write(answer(b"{}"))  # the first, at once; the second never
            await writer.drain()
            await read_request(reader)
            await wait_for_close(reader)

        async with Scripted(script) as url:
            pool = Pool(connect_timeout_s=3)
            response = await pool.post(
                url, HEADERS, b"{}", deadline=deadline(first_s), idempotent=False
            )
            assert await response.read(LIMIT) == b"{}"
            loop = asyncio.get_running_loop()
            sent = loop.time()
            async with asyncio.timeout(3):  # a deadline that waited for the first's 5 s fails
                with pytest.raises(DeadlineExceeded):
                    await pool.post(
                        url, HEADERS, b"{}", deadline=deadline(second_s), idempotent=False
                    )
            waited = loop.time() - sent
            assert waited >= second_s - 0.05  # not cut at the first exchange's deadline
            await pool.close()

    run(scenario)


def test_a_broken_answer_is_malformed_and_not_reused(run: Callable[[Scenario], None]) -> None:
    async def scenario() -> None:
        async with replying(lambda n: answer(b"{}") if n else b"SMTP ready\r\n\r\n") as url:
            pool = Pool(connect_timeout_s=3)
            with pytest.raises(Malformed):
                await post(pool, url)
            assert await (await post(pool, url)).read(LIMIT) == b"{}"
            await pool.close()

    run(scenario)


def test_a_second_answer_to_one_request_ends_the_connection(
    run: Callable[[Scenario], None],
) -> None:
    async def scenario() -> None:
        server = replying(lambda n: answer(b'{"n":%d}' % n) + answer(b'{"unasked":1}'))
        async with server as url:
            pool = Pool(connect_timeout_s=3)
            for n in range(2):
                assert await (await post(pool, url)).read(LIMIT) == b'{"n":%d}' % n
            await pool.close()
        assert server.accepted == 2

    run(scenario)


def test_an_interim_answer_is_skipped(run: Callable[[Scenario], None]) -> None:
    async def scenario() -> None:
        hints = b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
        async with replying(lambda n: hints + answer(b"{}")) as url:
            pool = Pool(connect_timeout_s=3)
            response = await post(pool, url)
            assert response.status == 200
            assert response.header(b"link") is None
            assert await response.read(LIMIT) == b"{}"
            await pool.close()

    run(scenario)


def test_abandoning_an_answer_closes_its_connection(run: Callable[[Scenario], None]) -> None:
    async def scenario() -> None:
        async def script(reader: Reader, writer: Writer, n: int) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
            writer.write(b"Transfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n")
            await writer.drain()
            await wait_for_close(reader)
            server.client_closed.set()

        server = Scripted(script)
        async with server as url:
            pool = Pool(connect_timeout_s=3)
            response = await pool.post(url, HEADERS, b"{}", deadline=deadline(), idempotent=False)
            assert await anext(response.chunks()) == b"data: 1\n\n"
            response.close()
            async with asyncio.timeout(5):
                await server.client_closed.wait()
            await pool.close()

    run(scenario)


def test_an_answer_read_to_its_end_closed_late_leaves_the_next_exchange_alone(
    run: Callable[[Scenario], None],
) -> None:
    """An answer read to its end gives its connection back to the pool; closing it later (as a
    caller's cleanup may, after awaits) must not abort the exchange the connection carries by
    then (found when a resumed stream was killed this way, gateway/bridge/rounds.py)."""

    async def scenario() -> None:
        async def echo(request: web.Request) -> web.Response:
            return web.json_response({"got": (await request.read()).decode()})

        app = web.Application()
        app.router.add_post("/mcp", echo)
        async with aiohttp_server(app) as url:
            pool = Pool(connect_timeout_s=3)
            first = await post(pool, url)
            assert await first.read(LIMIT) == b'{"got": "{}"}'
            second = await post(pool, url)  # on the same connection, back in the pool
            first.close()
            first.rearm(None)
            assert await second.read(LIMIT) == b'{"got": "{}"}'
            await pool.close()

    run(scenario)


def test_a_reused_connection_the_replica_dropped_is_retried_only_when_idempotent(
    run: Callable[[Scenario], None],
) -> None:
    async def scenario() -> None:
        async def script(reader: Reader, writer: Writer, n: int) -> None:
            await read_request(reader)
            writer.write(answer(b'{"conn":%d}' % n))
            await writer.drain()
            # The next request on this connection meets the replica closing it unanswered,
            # as when an idle keep-alive timer fires just as taskgate sends.
            await read_request(reader)

        async with Scripted(script) as url:
            pool = Pool(connect_timeout_s=3)
            assert await (await post(pool, url, idempotent=True)).read(LIMIT) == b'{"conn":0}'
            assert await (await post(pool, url, idempotent=True)).read(LIMIT) == b'{"conn":1}'
            with pytest.raises(Broken) as broken:
                await post(pool, url)
            assert not broken.value.answered
            await pool.close()

    run(scenario)


def test_idle_connections_past_the_idle_timeout_are_not_reused(
    run: Callable[[Scenario], None],
) -> None:
    async def scenario() -> None:
        server = replying(lambda n: answer(b"{}"))
        async with server as url:
            pool = Pool(connect_timeout_s=3, idle_timeout_s=0)
            for _ in range(3):
                await (await post(pool, url)).read(LIMIT)
            await pool.close()
        assert server.accepted == 3

    run(scenario)


def test_an_answer_over_the_limit_is_refused_and_its_connection_closed(
    run: Callable[[Scenario], None],
) -> None:
    async def scenario() -> None:
        async def script(reader: Reader, writer: Writer, n: int) -> None:
            await read_request(reader)
            writer.write(answer(b"[" + b"0," * 500_000 + b"0]"))
            await writer.drain()
            closed.append(await wait_for_close(reader))

        closed: list[bool] = []
        server = Scripted(script)
        async with server as url:
            pool = Pool(connect_timeout_s=3)
            response = await pool.post(url, HEADERS, b"{}", deadline=deadline(), idempotent=False)
            with pytest.raises(TooLarge):
                await response.read(1000)
            await server.settled()
            await pool.close()
        assert closed == [True]

    run(scenario)


def _tls_files(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it (PEM files)."""
    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("taskgate test CA"))
        .issuer_name(name("taskgate test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = (directory / "ca.pem", directory / "server.pem", directory / "server.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


def test_an_https_replica_is_verified_and_reused(
    run: Callable[[Scenario], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, cert, key = _tls_files(tmp_path)
    # The default context trusts what SSL_CERT_FILE names, as for any client on this machine.
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))

    async def scenario() -> None:
        peers: set[object] = set()

        async def echo(request: web.Request) -> web.Response:
            peers.add(request.transport.get_extra_info("peername") if request.transport else None)
            return web.json_response({"secure": request.secure})

        app = web.Application()
        app.router.add_post("/mcp", echo)
        server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_tls.load_cert_chain(cert, key)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls).start()
        port = runner.addresses[0][1]
        try:
            pool = Pool(connect_timeout_s=3)
            for _ in range(3):
                response = await post(pool, f"https://127.0.0.1:{port}/mcp")
                assert await response.read(LIMIT) == b'{"secure": true}'
            await pool.close()
            # A replica whose certificate no trusted CA signed is refused before any request.
            monkeypatch.setenv("SSL_CERT_FILE", str(cert))
            untrusting = Pool(connect_timeout_s=3)
            with pytest.raises(ConnectFailed):
                await post(untrusting, f"https://127.0.0.1:{port}/mcp")
            await untrusting.close()
        finally:
            await runner.cleanup()
        assert len(peers) == 1

    run(scenario)


# --- a replica's answer head is bounded ---------------------------------------------------

SMALL_HEAD = HeadLimits(max_header_bytes=1024, max_headers=16, max_head_bytes=4096)


def endless(start: bytes, piece: bytes) -> Scripted:
    """A replica that answers `start`, then `piece` over and over, until the client closes the
    connection or 8 MiB were sent (the bound of the test, far past any head limit)."""

    async def script(reader: Reader, writer: Writer, n: int) -> None:
        await read_request(reader)
        writer.write(start)
        sent = len(start)
        while sent < 8 * 1024 * 1024 and not writer.is_closing():
            writer.write(piece * 64)
            sent += len(piece) * 64
            await writer.drain()
        await wait_for_close(reader)

    return Scripted(script)


ENDLESS_HEADS = {
    # Measured before the bound: taskgate grew by 4.9 GB of RSS in 15 s, until the deadline.
    "endless-line": (b"HTTP/1.1 200 OK\r\nX-Endless: ", b"v" * 1024),
    "endless-fields": (b"HTTP/1.1 200 OK\r\n", b"X-Field: v\r\n"),
    "endless-interim-answers": (b"", b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"),
}


@pytest.mark.parametrize(("start", "piece"), ENDLESS_HEADS.values(), ids=ENDLESS_HEADS.keys())
def test_an_answer_head_that_never_ends_fails_at_its_bound_not_at_the_deadline(
    run: Callable[[Scenario], None], start: bytes, piece: bytes
) -> None:
    async def scenario() -> None:
        server = endless(start, piece)
        async with server as url:
            pool = Pool(connect_timeout_s=3, limits=SMALL_HEAD)
            loop = asyncio.get_running_loop()
            began = loop.time()
            with pytest.raises(HeadTooLarge):
                await pool.post(url, HEADERS, b"{}", deadline=began + 60, idempotent=False)
            assert loop.time() - began < 30  # long before the deadline
            await server.settled()  # the replica saw the connection close
            await pool.close()

    run(scenario)


@pytest.mark.parametrize(
    "extra",
    [
        [b"X-Long: " + b"v" * 1024],  # one line over max_header_bytes
        [b"X-%d: v" % n for n in range(17)],  # 17 fields + Content-Type/Length: over 16
        [b"X-%d: " % n + b"v" * 900 for n in range(5)],  # each line fits; the head does not
    ],
    ids=["line-over-the-limit", "fields-over-the-limit", "head-over-the-limit"],
)
def test_an_answer_head_over_its_limits_is_malformed(
    run: Callable[[Scenario], None], extra: list[bytes]
) -> None:
    async def scenario() -> None:
        async with replying(lambda n: answer(b"{}", *extra)) as url:
            pool = Pool(connect_timeout_s=3, limits=SMALL_HEAD)
            with pytest.raises(HeadTooLarge) as refused:
                await post(pool, url)
            assert isinstance(refused.value, Malformed)  # what the relay answers 502 for
            await pool.close()

    run(scenario)


def test_an_answer_head_at_its_limits_is_read(run: Callable[[Scenario], None]) -> None:
    async def scenario() -> None:
        at_limit = [b"X-Long: " + b"v" * (1024 - len(b"X-Long") - 2)]
        at_limit += [b"X-%d: v" % n for n in range(13)]  # 16 with Content-Type and -Length
        async with replying(lambda n: answer(b"{}", *at_limit)) as url:
            pool = Pool(connect_timeout_s=3, limits=SMALL_HEAD)
            response = await post(pool, url)
            assert len(response.headers) == 16
            assert await response.read(LIMIT) == b"{}"
            await pool.close()

    run(scenario)


def test_a_replica_has_its_own_head_limits_when_configured(
    run: Callable[[Scenario], None],
) -> None:
    async def scenario() -> None:
        many = [b"X-%d: v" % n for n in range(40)]
        async with replying(lambda n: answer(b"{}", *many)) as url:
            pool = Pool(connect_timeout_s=3, limits=SMALL_HEAD)
            pool.limit(url, HeadLimits(max_header_bytes=1024, max_headers=64, max_head_bytes=4096))
            assert await (await post(pool, url)).read(LIMIT) == b"{}"
            await pool.close()

    run(scenario)


CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def test_trailers_are_not_headers_of_the_answer(run: Callable[[Scenario], None]) -> None:
    # Found by the fuzzer: llhttp hands trailers over as headers, and they were appended to
    # the head the caller had already read (a replica could add Retry-After after the fact).
    async def scenario() -> None:
        wire = CHUNKED_HEAD + b"2\r\n{}\r\n0\r\nRetry-After: 99\r\n\r\n"
        async with replying(lambda n: wire) as url:
            pool = Pool(connect_timeout_s=3, limits=SMALL_HEAD)
            response = await post(pool, url)
            assert await response.read(LIMIT) == b"{}"
            assert response.header(b"retry-after") is None
            assert [name for name, _ in response.headers] == [
                b"content-type",
                b"transfer-encoding",
            ]
            await pool.close()

    run(scenario)


ENDLESS_TRAILERS = {
    "endless-trailer-line": (CHUNKED_HEAD + b"2\r\n{}\r\n0\r\nX-Endless: ", b"v" * 1024),
    "endless-trailer-fields": (CHUNKED_HEAD + b"2\r\n{}\r\n0\r\n", b"X-Trailer: v\r\n"),
}


@pytest.mark.parametrize(("start", "piece"), ENDLESS_TRAILERS.values(), ids=ENDLESS_TRAILERS.keys())
def test_trailers_that_never_end_fail_at_the_head_bound(
    run: Callable[[Scenario], None], start: bytes, piece: bytes
) -> None:
    async def scenario() -> None:
        server = endless(start, piece)
        async with server as url:
            pool = Pool(connect_timeout_s=3, limits=SMALL_HEAD)
            response = await post(pool, url)
            with pytest.raises(HeadTooLarge):
                await response.read(LIMIT)
            await server.settled()
            await pool.close()

    run(scenario)


@pytest.mark.parametrize(
    "interim",
    [
        b"HTTP/1.1 199 Odd\r\nContent-Length: 7\r\n\r\nINJECT!",
        b"HTTP/1.1 000 Zero\r\nContent-Length: 7\r\n\r\nINJECT!",
    ],
    ids=["interim-with-a-body", "status-below-100"],
)
def test_an_interim_answer_with_a_body_is_malformed_not_spliced(
    run: Callable[[Scenario], None], interim: bytes
) -> None:
    # Found by the fuzzer: llhttp reads a body for 104-199 (and below 100) by its framing,
    # and it was taken for the start of the final answer's body (b"INJECT!{}").
    async def scenario() -> None:
        async with replying(lambda n: interim + answer(b"{}")) as url:
            pool = Pool(connect_timeout_s=3)
            with pytest.raises(Malformed):
                await (await post(pool, url)).read(LIMIT)
            await pool.close()

    run(scenario)
