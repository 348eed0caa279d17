#!/usr/bin/env python3
"""Coverage-guided fuzzing of the public listener's framing (gateway/h1/, its server).

Each input is the bytes one client sends, cut into reads, and a few choices: how the handler
answers, whether the client ends its side or resets, whether the clock jumps between reads,
whether the socket pushes back on writes. An HTTPConnection is driven on an in-memory transport
and a virtual clock; what it wrote is then parsed back with llhttp. A broken property raises a
Violation, which atheris reports as a crash:

- no exception escapes a protocol callback, a timer or a task (the handler's own deliberate
  failure is answered with a 500 or cuts its stream, never escapes);
- what was written parses as a sequence of well-formed HTTP/1.1 answers, in the order of the
  requests (each carries its request's number), at most one per request the handler saw plus
  one refusal; nothing follows an answer that says Connection: close; header values hold no
  CR, LF or NUL and an echoed header comes back whole;
- nothing is written after the transport was closed;
- at most MAX_READ_AHEAD requests wait parsed behind the one being answered, and the bytes
  the server holds against its budget go back to zero once the connection is gone;
- a client that goes quiet is answered or dropped within the read and keep-alive timeouts;
- after connection_lost every handler task has ended and the connection is forgotten.

Input layout: flags (1 byte, the FLAG_* bits below), more flags (1 byte, the MORE_* bits),
clock tick (1 byte: the clock moves tick/32 s after each read), then the reads
(fuzzlib.reads). Run: see fuzz/README.md.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from dataclasses import dataclass

import atheris
import fuzzlib
import httptools
from fuzzlib import FakeTransport, LogRecorder, Violation, VirtualLoop, check, deliver

with atheris.instrument_imports(include=["gateway.h1"]):
    from gateway.h1 import server
    from gateway.h1.limits import Limits, Refused
    from gateway.h1.request import DownstreamRequest, DownstreamResponse, Reply
    from gateway.h1.server import Server

# Requests the server may hold parsed behind the one being answered: one, as uvicorn and aiohttp
# read ahead (limits.PIPELINE_DEPTH since the flow-control change; it was 8 and unenforced).
MAX_READ_AHEAD = 1

LIMITS = Limits(
    max_header_bytes=256,
    max_headers=8,
    max_body_bytes=256,
    read_timeout_s=1.0,
    keepalive_timeout_s=2.0,
    max_buffered_bytes=512,  # one connection reaches the process's budget (503)
    max_requests_per_connection=4,
)
# A quiet client is answered or dropped within this (virtual) time: a read timeout for a request
# that never ends, a keep-alive timeout after the last answer, twice over for timers re-armed
# once by a busy connection.
QUIET_S = 2 * (LIMITS.read_timeout_s + LIMITS.keepalive_timeout_s) + 1

FLAG_EOF = 1 << 0  # the client ends its side after its last read
FLAG_RESET = 1 << 1  # the client resets after its last read instead of waiting for the server
FLAG_PUSH_BACK = 1 << 5  # every write fills the socket's buffer until the next loop step
FLAG_ECHO = 1 << 6  # the handler copies the request's X-Echo into its answer, as relay does
FLAG_YIELD = 1 << 7  # the handler lets the loop run before answering (requests pile up)
# More flags.
MORE_ECHO_TEXT = 1 << 0  # the echo is request.headers.get(), decoded as text (surrogates kept)
# Bits 2-4 of the flags: how the handler answers.
ANSWER_SHIFT = 2
RESPOND, STREAM, STREAM_OPEN, FAIL, FAIL_MID_STREAM, RESPOND_UNREAD = range(2, 8)

REFUSAL_BODY = b"refusal"


class HandlerFailure(Exception):
    """The handler's deliberate unexpected failure."""


class App:
    """The handler: reads the body, answers with the request's number in the body."""

    def __init__(self, flags: int, more: int) -> None:
        self.answer = (flags >> ANSWER_SHIFT) & 7
        self.echo = bool(flags & FLAG_ECHO)
        self.echo_text = bool(more & MORE_ECHO_TEXT)
        self.yields = bool(flags & FLAG_YIELD)
        self.seen: list[DownstreamRequest] = []
        self.failed: set[int] = set()  # numbers of requests whose handler failed (500 is right)
        self.bodies: dict[int, bytes] = {}  # the bodies the handler read, by request number

    async def __call__(self, request: DownstreamRequest) -> Reply:
        number = len(self.seen)
        self.seen.append(request)
        tag = b"#%d" % number
        if self.yields:
            for _ in range(3):
                await asyncio.sleep(0)
        headers = {}
        if self.echo:
            echoed = echo_of(request, text=self.echo_text)
            if echoed is not None:
                headers["X-Echo"] = echoed
                if not safe(echoed):
                    self.failed.add(number)  # the server must refuse to write it: 500
        body = b""
        if self.answer != RESPOND_UNREAD:
            try:
                body = await request.read()
                self.bodies[number] = body
            except Refused as exc:
                return DownstreamResponse(exc.status, tag + b" refused", "text/plain", headers)
        # A HEAD answer has no body, and the server does not special-case HEAD in streams (the
        # listener never streams one): HEAD gets a whole DownstreamResponse.
        if self.answer in (STREAM, STREAM_OPEN, FAIL_MID_STREAM) and request.method != "HEAD":
            stream = request.stream(200, {"Content-Type": "text/event-stream", **headers})
            await stream.write(tag + b" one;")
            if self.answer == FAIL_MID_STREAM:
                self.failed.add(number)
                raise HandlerFailure("the handler failed mid-stream")
            await stream.write(b"two;")
            if self.answer == STREAM:
                await stream.end()
            return stream
        if self.answer == FAIL:
            self.failed.add(number)
            raise HandlerFailure("the handler failed")
        return DownstreamResponse(200, tag + b" %d" % len(body), "text/plain", headers)


def echo_of(request: DownstreamRequest, *, text: bool) -> str | None:
    if text:
        return request.headers.get("x-echo")  # surrogates for bytes that are not UTF-8
    for name, value in request.raw_headers:
        if name.lower() == b"x-echo":
            return value.decode("latin-1")  # as relay copies a replica's header back
    return None


def safe(value: str) -> bool:
    try:
        raw = value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return not any(c in raw for c in (b"\r", b"\n", b"\0"))


def refusal(status: int, reason: str) -> DownstreamResponse:
    return DownstreamResponse(status, REFUSAL_BODY, "text/plain")


# -- reading back what the server wrote -----------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    close_delimited: bool

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def closes(self) -> bool:
        return b"close" in (self.header(b"connection") or b"").lower()


class _Message:
    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.head_done = False
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


def _feed(parser: httptools.HttpResponseParser, data: bytes, wire: bytes) -> None:
    try:
        parser.feed_data(data)
    except httptools.HttpParserError as exc:
        raise Violation("framing", f"the answers do not parse ({exc!r}): {wire!r}") from None


def split_answers(wire: bytes, methods: list[str]) -> list[Answer]:
    """The answers in `wire`, each parsed by llhttp; `methods` are those of the requests the
    handler saw, in order (a HEAD answer has no body, which llhttp cannot know by itself)."""
    answers = []
    at = 0
    finals = 0
    while at < len(wire):
        end = wire.find(b"\r\n\r\n", at)
        check(end >= 0, "framing", lambda at=at: f"no end to a head: {wire[at:]!r}")
        message = _Message()
        parser = httptools.HttpResponseParser(message)
        _feed(parser, wire[at : end + 4], wire)
        check(message.head_done, "framing", lambda h=wire[at:end]: f"not a head: {h!r}")
        status = parser.get_status_code()
        at = end + 4
        method = methods[finals] if status >= 200 and finals < len(methods) else ""
        length = next((v for k, v in message.headers if k == b"content-length"), None)
        chunked = any(k == b"transfer-encoding" for k, _ in message.headers)
        close_delimited = False
        if status < 200 or status in (204, 304) or method == "HEAD":
            pass  # no body, whatever the head says
        elif length is not None:
            size = int(length)
            body = wire[at : at + size]
            check(len(body) == size, "framing", lambda: f"a body is cut short: {wire!r}")
            _feed(parser, body, wire)
            at += size
        elif chunked:
            # One byte at a time, to learn where the last chunk ends (llhttp does not say). A
            # stream that is cut never ends: the end of the connection tells the client so.
            while not message.complete and at < len(wire):
                _feed(parser, wire[at : at + 1], wire)
                at += 1
        else:
            _feed(parser, wire[at:], wire)  # the end of the connection ends the body
            at = len(wire)
            close_delimited = True
        answers.append(Answer(status, message.headers, bytes(message.body), close_delimited))
        if status >= 200:
            finals += 1
    return answers


class _Request:
    def __init__(self) -> None:
        self.method = ""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""
        self.complete = False


class _Requests:
    """The requests in what the client sent, as one llhttp parser sees them all at once."""

    def __init__(self, data: bytes) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.requests: list[_Request] = []
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            # llhttp stops after an upgrade request's head; the server reads its body by length.
            last = self.requests[-1]
            length = next((v for k, v in last.headers if k == b"content-length"), b"0")
            at = upgrade.args[0]
            last.body = data[at : at + int(length)]
            last.complete = len(last.body) == int(length)
        except httptools.HttpParserError:
            pass  # the requests before the error are the ones to compare

    def on_message_begin(self) -> None:
        self.requests.append(_Request())

    def on_header(self, name: bytes, value: bytes) -> None:
        self.requests[-1].headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.requests[-1].method = self.parser.get_method().decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.requests[-1].body += body

    def on_message_complete(self) -> None:
        self.requests[-1].complete = True


def check_requests(app: App, sent: bytes, over_budget: bool) -> None:
    """The handler saw the requests the client sent, in order, and read their bodies as sent:
    however the bytes were cut, paused, stashed or refused, no byte moves between requests.
    A mismatch after the server turned bytes away over its budget is named budget_splice, so
    that FUZZ_SKIP can set that known finding aside without hiding the others."""
    mismatch = "budget_splice" if over_budget else "body_mismatch"
    reference = _Requests(sent).requests
    for number, request in enumerate(app.seen):
        check(
            number < len(reference) and reference[number].method == request.method,
            "phantom_request",
            lambda n=number: f"request {n} is not one the client sent: {sent!r}",
        )
        body = app.bodies.get(number)
        if body is not None:
            expected = reference[number]
            check(
                expected.complete and body == expected.body,
                mismatch,
                lambda n=number, b=body, e=expected: (
                    f"request {n}'s body was read as {b!r}; the client sent {e.body!r} "
                    f"(complete: {e.complete}) in {sent!r}"
                ),
            )


def check_answers(app: App, wire: bytes) -> None:
    methods = [request.method for request in app.seen]
    answers = split_answers(wire, methods)
    for index, answer in enumerate(answers):
        for name, value in answer.headers:
            check(
                not any(c in value or c in name for c in (b"\r", b"\n", b"\0")),
                "header_value",
                lambda name=name, value=value: f"header {name!r}: {value!r} in {wire!r}",
            )
        later = answers[index + 1 :]
        check(
            not (answer.closes and later),
            "after_close",
            lambda: f"an answer follows one that said Connection: close: {wire!r}",
        )
        check(
            not (answer.close_delimited and not answer.closes),
            "framing",
            lambda: f"a body without framing and without Connection: close: {wire!r}",
        )
    finals = [a for a in answers if a.status >= 200]
    check(
        len(finals) <= len(app.seen) + 1,
        "answer_count",
        lambda: f"{len(finals)} answers to {len(app.seen)} requests: {wire!r}",
    )
    for number, answer in enumerate(finals):
        if number == len(app.seen):
            check(
                answer.body == REFUSAL_BODY and answer.status >= 400,
                "order",
                lambda: f"the answer after the last request is not a refusal: {wire!r}",
            )
            continue
        request = app.seen[number]
        if request.method == "HEAD":
            continue
        tag = b"#%d " % number
        if answer.body == REFUSAL_BODY:
            check(
                answer.status == 500 and number in app.failed,
                "order",
                lambda number=number: f"request {number} got the server's refusal: {wire!r}",
            )
            continue
        check(
            answer.body.startswith(tag),
            "order",
            lambda number=number: f"answer {number} is not request {number}'s: {wire!r}",
        )
        echoed = next((v for k, v in request.raw_headers if k.lower() == b"x-echo"), None)
        if app.echo and echoed is not None and answer.status == 200 and number not in app.failed:
            got = answer.header(b"x-echo") or b""
            check(
                got.strip(b" \t") == echoed.strip(b" \t"),
                "header_value",
                lambda echoed=echoed, got=got: f"X-Echo {echoed!r} came back as {got!r}",
            )


# -- one input ------------------------------------------------------------------------------

LOOP = VirtualLoop()
asyncio.set_event_loop(LOOP)
LOG = LogRecorder("taskgate.listener")


def watch_budget(conn: server.HTTPConnection) -> list[int]:
    """The sizes the server turned away over its budget (its _hold said no), as they happen."""
    refused: list[int] = []
    hold = getattr(conn, "_hold", None)
    if hold is not None:

        def watched(size: int) -> bool:
            fits = bool(hold(size))
            if not fits:
                refused.append(size)
            return fits

        conn._hold = watched  # type: ignore[method-assign]
    return refused


def read_ahead(conn: server.HTTPConnection) -> int:
    return len(getattr(conn, "_queue", ()))


async def scenario(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    flags = fdp.ConsumeUInt(1)
    more = fdp.ConsumeUInt(1)
    tick = fdp.ConsumeUInt(1) / 32
    pending = deque(fuzzlib.reads(fdp))
    fuzzlib.trace(f"flags {flags:#04x} more {more:#04x} tick {tick:g} s; reads:")
    for piece in pending:
        fuzzlib.trace(f"  {piece!r}")

    app = App(flags, more)
    srv = Server(app, LIMITS, refusal)
    conn = srv()
    transport = FakeTransport(LOOP, conn)
    transport.push_back = bool(flags & FLAG_PUSH_BACK)
    over_budget = watch_budget(conn)
    deliver(lambda: conn.connection_made(transport), "connection_made")

    def bounded() -> None:
        check(
            read_ahead(conn) <= MAX_READ_AHEAD,
            "read_ahead",
            lambda: f"{read_ahead(conn)} requests parsed ahead of the one answered",
        )
        held = getattr(srv, "buffered", 0)
        check(
            0 <= held <= LIMITS.max_buffered_bytes,
            "budget",
            f"the server counts {held} bytes held against a budget of {LIMITS.max_buffered_bytes}",
        )

    delivered = bytearray()
    waited = 0.0
    while pending and not transport.closing:
        await fuzzlib.settle(LOOP)
        bounded()
        if transport.closing:
            break
        if not transport.reading:
            # Paused: only the server's own progress (or a timeout) can resume it.
            if waited >= QUIET_S:
                break
            await fuzzlib.advance(LOOP, 0.25)
            waited += 0.25
            continue
        piece = pending.popleft()
        deliver(lambda piece=piece: conn.data_received(piece), "data_received")
        delivered += piece
        bounded()
        if tick:
            await fuzzlib.advance(LOOP, tick)
    await fuzzlib.settle(LOOP)
    bounded()

    if flags & FLAG_EOF and not pending and transport.reading and not transport.closing:
        deliver(transport.receive_eof, "eof_received")
        await fuzzlib.settle(LOOP)
    if flags & FLAG_RESET:
        transport.hang_up(ConnectionResetError("the client reset the connection"))
    else:
        # The client says nothing more: the server must answer and close, or time out.
        for _ in range(int(QUIET_S / 0.25)):
            if transport.lost:
                break
            await fuzzlib.advance(LOOP, 0.25)
        check(
            transport.closing,
            "hang",
            lambda: (
                f"still open {QUIET_S:g} s after the client went quiet; wrote "
                f"{bytes(transport.written)!r}"
            ),
        )
    transport.hang_up(ConnectionResetError("the client left"))
    await fuzzlib.settle(LOOP)
    check(transport.lost, "lost", "connection_lost was never called")
    # Timers left behind must be harmless when they fire.
    await fuzzlib.advance(LOOP, QUIET_S, step=1.0)

    check(
        not transport.late_writes,
        "write_after_close",
        lambda: f"written after close(): {transport.late_writes!r}",
    )
    check(not srv.connections, "conn_leak", "the server still holds the connection")
    held = getattr(srv, "buffered", 0)
    check(held == 0, "budget", f"{held} bytes still counted held after the connection closed")
    errors = [r for r in LOG.records if r.levelname in ("ERROR", "CRITICAL")]
    for record in errors:
        failure = record.exc_info[1] if record.exc_info else None
        check(
            isinstance(failure, HandlerFailure)
            or (app.failed and record.getMessage().startswith("an answer was not sent"))
            or (app.failed and type(failure).__name__ == "BadHeaderValue"),
            "logged_error",
            lambda r=record, f=failure: f"the server logged {r.getMessage()!r}: {f!r}",
        )
    fuzzlib.trace(f"delivered {len(delivered)} bytes; the handler saw {len(app.seen)} requests")
    fuzzlib.trace(f"read bodies: {app.bodies!r}")
    fuzzlib.trace(f"written: {bytes(transport.written)!r}")
    check_requests(app, bytes(delivered), bool(over_budget))
    check_answers(app, bytes(transport.written))


def test_one_input(data: bytes) -> None:
    LOG.records.clear()
    LOOP.run_input(lambda: scenario(data))


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
