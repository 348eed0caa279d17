#!/usr/bin/env python3
"""Coverage-guided fuzzing of the relay client's framing (gateway/upstream/connection.py).

Each input is the bytes a replica answers, cut into reads, and a few choices: how the caller
reads the answer (whole, chunk by chunk, one chunk then close, close at once), how the
connection ends, whether the clock jumps between reads, and whether a second exchange follows
on a pooled connection. A Connection sends its request with exchange() over an in-memory
transport on a virtual clock; the same bytes go to a fresh llhttp parser, the reference. A
broken property raises a Violation, which atheris reports as a crash:

- exchange(), read_body() and chunks() return a well-formed answer or raise an
  ExchangeError subclass, nothing else, and always end (the deadline ends every wait);
- an answer is the reference's first final answer: its status, headers and body, never an
  interim one's; header values hold no CR, LF or NUL (relay copies some back to the client);
- an answer the reference completed, read by a caller whose limit admits it before any
  deadline, succeeds;
- a connection goes back to the pool only after its answer was read to its end, with
  keep-alive, and no byte of another answer in hand; bytes arriving on an idle connection
  close it;
- no task is left pending, no timer armed after the exchange, nothing written after close;
- what the connection holds of an answer's head stays under HEAD_LIMIT, and an answer
  whose head passes HEAD_LIMITS fails with HeadTooLarge rather than being taken.

Input layout: flags (1 byte, the FLAG_* and mode bits below), clock tick (1 byte: the clock
moves tick/64 s after each read), read limit (2 bytes, little-endian), then the reads
(fuzzlib.reads). Run: see fuzz/README.md.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import atheris
import fuzzlib
import httptools
from fuzzlib import FakeTransport, Violation, VirtualLoop, check, deliver

with atheris.instrument_imports(include=["gateway.upstream"]):
    from gateway.upstream import backlog
    from gateway.upstream.connection import Connection
    from gateway.upstream.framing import ExchangeError, HeadLimits, HeadTooLarge

# Small head limits, so that inputs of a few KiB reach them.
HEAD_LIMITS = HeadLimits(max_header_bytes=128, max_headers=8)
# (bytes, fields): the most of an answer's head a Connection may hold, every field at its
# line limit; None turns the check off.
HEAD_LIMIT: tuple[int, int] | None = (
    HEAD_LIMITS.max_header_bytes * HEAD_LIMITS.max_headers,
    HEAD_LIMITS.max_headers,
)

# Small water marks, so inputs of a few hundred bytes reach back-pressure.
backlog.HIGH_WATER = 48
backlog.LOW_WATER = 16

REQUEST = b"POST /mcp HTTP/1.1\r\nHost: replica\r\nContent-Length: 2\r\n\r\n{}"
DEADLINE_S = 1.0

# Bits 0-1: how the caller reads the answer.
READ, ITERATE, ONE_CHUNK, CLOSE = range(4)
# Bits 2-3: how the connection ends once the replica has nothing more to send.
EOF, RESET, SILENT, LOST = range(4)
END_SHIFT = 2
FLAG_NEXT = 1 << 4  # a second exchange starts on a pooled connection before the rest arrives


@dataclass
class Outcome:
    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes | None = None  # None when the caller did not read it to its end
    error: ExchangeError | None = None
    headers_after: list[tuple[bytes, bytes]] = field(default_factory=list)  # once read


async def caller(conn: Connection, mode: int, limit: int, deadline: float) -> Outcome:
    """What relay does with an answer; anything but an ExchangeError escaping is a finding."""
    outcome = Outcome()
    try:
        response = await conn.exchange(REQUEST, deadline)
        outcome.status = response.status
        outcome.headers = list(response.headers)
        if mode == READ:
            outcome.body = await response.read(limit)
        elif mode == ITERATE:
            outcome.body = b"".join([chunk async for chunk in response.chunks()])
        elif mode == ONE_CHUNK:
            chunks = response.chunks()
            got = [chunk async for chunk in _first(chunks)]
            if not got:
                outcome.body = b""  # the body was empty: read to its end all the same
            await chunks.aclose()  # type: ignore[attr-defined]
            response.close()
        else:
            response.close()
        outcome.headers_after = list(response.headers)
    except ExchangeError as exc:
        outcome.error = exc
    return outcome


async def _first(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield chunk
        return


class Reference:
    """The same reads through a fresh llhttp parser: what the answer is."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.messages: list[Message] = []
        self.error: BaseException | None = None
        self.head_bytes = 0  # bytes of the reads that did not end the final head

    def feed(self, data: bytes) -> None:
        if self.error is None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError as exc:  # HttpParserUpgrade included
                self.error = exc
                return
            if self.final is None:
                self.head_bytes += len(data)

    def interim_body(self) -> bool:
        """Whether an answer before the final one (a status under 200) has a body to llhttp:
        a 1xx it does not know as bodiless, or a status under 100."""
        return any(m.head_done and m.status < 200 and m.body for m in self.messages)

    def over(self, limits: HeadLimits) -> bool:
        """Whether these heads pass `limits`: a line's bytes, the fields of one head, or all
        the bytes before the final head ends."""
        final = self.final
        upto = self.messages.index(final) + 1 if final is not None else len(self.messages)
        for message in self.messages[:upto]:  # after the final answer, Connection reads nothing
            fields = message.headers + message.trailers
            if len(fields) > limits.max_headers:
                return True
            if any(len(n) + len(v) + 2 > limits.max_header_bytes for n, v in fields):
                return True
        return self.head_bytes > limits.max_head_bytes

    @property
    def final(self) -> Message | None:
        return next((m for m in self.messages if m.status >= 200), None)

    @property
    def beyond(self) -> bool:
        """Bytes past the first final answer (another message, or an error after it)."""
        final = self.final
        if final is None or not final.complete:
            return False
        return self.messages[-1] is not final or self.error is not None

    def on_message_begin(self) -> None:
        self.messages.append(Message())

    def on_header(self, name: bytes, value: bytes) -> None:
        message = self.messages[-1]
        fields = message.trailers if message.head_done else message.headers
        fields.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        message = self.messages[-1]
        message.status = self.parser.get_status_code()
        message.head_done = True
        message.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.messages[-1].body += body

    def on_message_complete(self) -> None:
        self.messages[-1].complete = True


@dataclass
class Message:
    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)
    head_done: bool = False
    complete: bool = False
    keep_alive: bool = False


# -- one input ------------------------------------------------------------------------------

LOOP = VirtualLoop()
asyncio.set_event_loop(LOOP)


def head_held(conn: Connection) -> tuple[int, int]:
    headers = getattr(conn, "_headers", [])
    return sum(len(n) + len(v) for n, v in headers), len(headers)


async def scenario(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    flags = fdp.ConsumeUInt(1)
    tick = fdp.ConsumeUInt(1) / 64
    limit = fdp.ConsumeUInt(2)
    pending = deque(fuzzlib.reads(fdp))
    mode = flags & 3
    end = (flags >> END_SHIFT) & 3
    fuzzlib.trace(f"flags {flags:#04x} (mode {mode}, end {end}) tick {tick:g} s limit {limit}")
    for piece in pending:
        fuzzlib.trace(f"  {piece!r}")

    pooled: list[bool] = []  # each release: True when the connection was open (back to the pool)
    conn = Connection(LOOP, lambda c: pooled.append(not c.closed), HEAD_LIMITS)
    transport = FakeTransport(LOOP, conn)
    deliver(lambda: conn.connection_made(transport), "connection_made")

    for _ in range(2):  # a second exchange only on a pooled connection
        deadline = LOOP.now + DEADLINE_S
        sent_at = len(transport.written)
        releases = len(pooled)
        task = LOOP.create_task(caller(conn, mode, limit, deadline))
        reference = Reference()
        await fuzzlib.settle(LOOP)
        fed_all = False
        while not task.done():
            if not pending:
                fed_all = True
                break
            if transport.closing:
                break
            if not transport.reading:
                break  # settled and still paused: the caller stopped reading; the deadline ends it
            piece = pending.popleft()
            reference.feed(piece)
            deliver(lambda piece=piece: conn.data_received(piece), "data_received")
            check_head(conn)
            if tick:
                await fuzzlib.advance(LOOP, tick)
            await fuzzlib.settle(LOOP)
        if fed_all and not task.done() and not transport.closing:
            if end == EOF and transport.reading:
                deliver(transport.receive_eof, "eof_received")
            elif end == RESET:
                transport.hang_up(ConnectionResetError("the replica reset the connection"))
            elif end == LOST:
                transport.hang_up(None)
        await fuzzlib.settle(LOOP)
        if not task.done():
            await fuzzlib.advance(LOOP, max(0.0, deadline - LOOP.now) + DEADLINE_S, step=0.5)
        check(task.done(), "hang", "the caller still waits after the deadline")
        failure = task.exception()
        if failure is not None:
            raise Violation("escape", f"the caller got {failure!r}") from failure
        outcome = task.result()
        check(
            transport.written[sent_at:] == REQUEST,
            "request",
            lambda at=sent_at: f"sent {bytes(transport.written[at:])!r}",
        )
        fuzzlib.trace(f"outcome {outcome!r}; released {pooled[releases:]}")
        released = pooled[releases:]
        check_outcome(outcome, reference, mode, limit, end, tick, fed_all)
        back = [p for p in released if p]
        check(len(back) <= 1, "pool", f"released to the pool {len(back)} times")
        if back:
            check_pooled(outcome, reference, conn)
        check(
            getattr(conn, "_timer", None) is None or conn._timer.cancelled(),  # type: ignore[union-attr]
            "timer_leak",
            "the exchange's deadline timer is still armed after it ended",
        )
        if not back or conn.closed or not pending:
            break
        if not flags & FLAG_NEXT:
            # Bytes nobody asked for arrive on the idle connection: it must not be reused.
            piece = pending.popleft()
            deliver(lambda piece=piece: conn.data_received(piece), "data_received")
            check(conn.closed, "stray", lambda p=piece: f"an idle connection took {p!r} and stayed")
            break

    if not transport.closing:
        transport.hang_up(ConnectionResetError("the replica left"))
    await fuzzlib.settle(LOOP)
    check(
        not transport.late_writes,
        "write_after_close",
        lambda: f"written after close(): {transport.late_writes!r}",
    )


def check_head(conn: Connection) -> None:
    if HEAD_LIMIT is None:
        return
    held = head_held(conn)
    check(
        held[0] <= HEAD_LIMIT[0] and held[1] <= HEAD_LIMIT[1],
        "head_limit",
        lambda: f"holds {held[0]} bytes in {held[1]} header fields of one answer",
    )


def check_outcome(
    outcome: Outcome,
    reference: Reference,
    mode: int,
    limit: int,
    end: int,
    tick: float,
    fed_all: bool,
) -> None:
    final = reference.final
    if isinstance(outcome.error, HeadTooLarge):
        check(
            reference.over(HEAD_LIMITS),
            "head_limit",
            lambda: f"{outcome.error!r} for heads within the limits: {reference.messages!r}",
        )
        return
    if outcome.error is None:
        check(final is not None, "phantom", "an answer llhttp never saw whole-headed")
        assert final is not None
        check(
            not reference.over(HEAD_LIMITS),
            "head_limit",
            lambda: f"an answer taken though its head passes the limits: {outcome.headers!r}",
        )
        check(outcome.status >= 200, "interim", f"an interim {outcome.status} as the answer")
        merged = outcome.headers[: len(final.headers)] == final.headers and (
            final.trailers[: len(outcome.headers) - len(final.headers)]
            == outcome.headers[len(final.headers) :]
        )
        check(
            (outcome.status, outcome.headers) == (final.status, final.headers),
            # Trailers that arrived before the caller looked at the head show in it too.
            "trailer_merged" if merged and outcome.status == final.status else "head_mismatch",
            lambda: (
                f"answer {outcome.status} {outcome.headers!r}, "
                f"llhttp {final.status} {final.headers!r}"
            ),
        )
        check(
            outcome.headers_after == outcome.headers,
            "trailer_merged",
            lambda: f"the answer's headers grew as its body was read: {outcome.headers_after!r}",
        )
        for name, value in outcome.headers:
            check(
                not any(c in value for c in (b"\r", b"\n", b"\0")),
                "header_value",
                lambda name=name, value=value: f"header {name!r}: {value!r}",
            )
        if outcome.body is not None:
            check(
                mode != READ or len(outcome.body) <= limit,
                "limit",
                lambda: f"read {len(outcome.body or b'')} bytes past the limit {limit}",
            )
            check(
                outcome.body == final.body,
                # Named apart: a known finding (the body of an answer taken as interim is
                # added to the final one's), so that FUZZ_SKIP can set it aside alone.
                "interim_body" if reference.interim_body() else "body_mismatch",
                lambda: f"body {outcome.body!r}, llhttp {final.body!r}",
            )
            check(
                final.complete or (fed_all and end in (EOF, LOST) and unframed(final)),
                "truncated",
                lambda: f"a body taken as whole that did not end: {outcome.body!r}",
            )
        return
    # Failed: fine, unless llhttp had the whole answer in time for a caller that could take it:
    # ended by its framing, or (no framing) by a clean end of the connection.
    within = mode in (READ, ITERATE) and not tick and final is not None
    admits = final is not None and (mode == ITERATE or len(final.body) <= limit)
    whole = final is not None and (
        final.complete
        or (fed_all and end in (EOF, LOST) and reference.error is None and unframed(final))
    )
    check(
        not (within and admits and whole),
        "spurious_error",
        lambda: f"{outcome.error!r} for an answer llhttp read whole: {final!r}",
    )


def unframed(message: Message) -> bool:
    """Whether the end of the connection ends this answer's body. llhttp says so too for a
    Transfer-Encoding whose last coding is not chunked (RFC 9112 6.3); Connection refuses
    those (it relays no coding it cannot undo), which is its right: any coding counts here."""
    sized = any(k in (b"content-length", b"transfer-encoding") for k, _ in message.headers)
    return not sized and message.status not in (204, 304)


def check_pooled(outcome: Outcome, reference: Reference, conn: Connection) -> None:
    final = reference.final
    check(
        outcome.error is None and outcome.body is not None,
        "pool",
        lambda: f"pooled after {outcome!r}",
    )
    check(
        final is not None and final.complete and final.keep_alive,
        "pool",
        lambda: f"pooled though llhttp says {final!r}",
    )
    check(not reference.beyond, "pool", "pooled with another answer's bytes in hand")


def test_one_input(data: bytes) -> None:
    LOOP.run_input(lambda: scenario(data))


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
