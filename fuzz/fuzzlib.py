"""What both framing harnesses share: a loop on a virtual clock, an in-memory transport, the
way an input is cut into reads, and the checks that turn a broken property into a crash.

Nothing here imports the gateway: the harnesses import it under atheris's instrumentation, and
a module imported first here would be imported without it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import atheris

# Checks named in FUZZ_SKIP (comma-separated) are not enforced: a way to keep hunting while a
# known finding waits for its fix. Everything is enforced by default.
SKIP = frozenset(name.strip() for name in os.environ.get("FUZZ_SKIP", "").split(",") if name)

# FUZZ_VERBOSE=1: each input tells what it did on stderr (for replaying one input, not fuzzing).
VERBOSE = bool(os.environ.get("FUZZ_VERBOSE"))

# More rounds than this without the loop running dry is a livelock, not a slow handler.
SETTLE_ROUNDS = 500
MAX_CUTS = 8


class Violation(AssertionError):
    """A property failed; `check` is its name, the one FUZZ_SKIP takes."""

    def __init__(self, check: str, message: str) -> None:
        super().__init__(f"[{check}] {message}")
        self.check = check


def check(condition: object, name: str, message: Callable[[], str] | str) -> None:
    if condition or name in SKIP:
        return
    raise Violation(name, message() if callable(message) else message)


def trace(*parts: object) -> None:
    if VERBOSE:
        print(*parts, file=sys.stderr)


# -- the input ------------------------------------------------------------------------------


def reads(fdp: atheris.FuzzedDataProvider) -> list[bytes]:
    """The rest of the input as the reads a socket would deliver: one byte for how many cuts,
    two (little-endian) per cut position, then the bytes themselves."""
    count = fdp.ConsumeUInt(1) % (MAX_CUTS + 1)
    raw = [fdp.ConsumeUInt(2) for _ in range(count)]
    payload = fdp.ConsumeBytes(fdp.remaining_bytes())
    points = sorted({at % (len(payload) + 1) for at in raw})
    edges = [0, *points, len(payload)]
    return [payload[a:b] for a, b in itertools.pairwise(edges) if b > a]


def encode(control: bytes, cuts: list[int], payload: bytes) -> bytes:
    """The input that `reads` (after `control` was consumed) turns into `payload` cut at `cuts`;
    for writing seeds."""
    assert len(cuts) <= MAX_CUTS
    return control + bytes([len(cuts)]) + b"".join(c.to_bytes(2, "little") for c in cuts) + payload


# -- the loop -------------------------------------------------------------------------------


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when the harness says: timeouts fire on demand,
    and nothing ever waits in real time (the harness always has a step ready to run)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.tasks: list[asyncio.Task[Any]] = []
        self.errors: list[dict[str, Any]] = []
        self.set_task_factory(self._task)
        self.set_exception_handler(lambda _, context: self.errors.append(context))

    def time(self) -> float:
        return self.now

    def _task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        self.tasks.append(task)
        return task

    def quiet(self) -> bool:
        # Private, but the only way to tell "nothing left to run" from "not run enough yet".
        return not self._ready  # type: ignore[attr-defined]

    def run_input(self, body: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run one input's scenario; then every task it started must have ended, none with an
        exception, and the loop must have reported nothing. The next input starts clean."""
        self.tasks.clear()
        self.errors.clear()
        try:
            self.run_until_complete(body())
        finally:
            leftover = [t for t in self.tasks[1:] if not t.done()]
            failed = _failures(self.tasks[1:])
            for task in leftover:
                task.cancel()
            for handle in self._scheduled:  # type: ignore[attr-defined]
                handle.cancel()
            for _ in range(3):
                self.run_until_complete(asyncio.sleep(0))
            _failures(self.tasks)  # retrieved: asyncio would log them later, at another input
            errors = list(self.errors)
            self.tasks.clear()
            self.errors.clear()
        check(not leftover, "task_leak", lambda: f"tasks still pending at the end: {leftover}")
        check(not failed, "task_failed", lambda: f"a task ended with {failed[0]!r}")
        check(not errors, "loop_error", lambda: f"the loop reported: {_contexts(errors)}")


def _failures(tasks: list[asyncio.Task[Any]]) -> list[BaseException]:
    found = []
    for task in tasks:
        if task.done() and not task.cancelled():
            exc = task.exception()
            if exc is not None:
                found.append(exc)
    return found


def _contexts(errors: list[dict[str, Any]]) -> str:
    return "; ".join(f"{c.get('message')}: {c.get('exception')!r}" for c in errors)


async def settle(loop: VirtualLoop) -> None:
    """Run every step that is ready, and what they make ready, until nothing is left."""
    for _ in range(SETTLE_ROUNDS):
        await asyncio.sleep(0)
        if loop.quiet():
            return
    check(False, "livelock", f"the loop was still busy after {SETTLE_ROUNDS} rounds")


async def advance(loop: VirtualLoop, seconds: float, step: float = 0.25) -> None:
    """Move the clock on by `seconds`, a step at a time, letting due timers run at each."""
    end = loop.now + seconds
    while loop.now < end:
        loop.now = min(end, loop.now + step)
        await settle(loop)


# -- the transport --------------------------------------------------------------------------


class FakeTransport(asyncio.Transport):
    """A socket's transport in memory, as asyncio's selector transport behaves: close() and
    abort() call connection_lost on the next loop step, pause_reading stops deliveries (the
    harness honours it), and with `push_back` every write fills the buffer (pause_writing)
    until the next step drains it (resume_writing)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self._loop = loop
        self._protocol = protocol
        self.push_back = False
        self.written = bytearray()
        self.late_writes: list[bytes] = []  # written after close(): a real socket sends these
        self.closing = False
        self.lost = False
        self.reading = True
        self.write_paused = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closing:
            self.late_writes.append(bytes(data))
            return
        self.written += data
        if self.push_back and not self.write_paused:
            self.write_paused = True
            self._protocol.pause_writing()
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        if self.write_paused and not self.lost:
            self.write_paused = False
            self._protocol.resume_writing()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.hang_up(None)

    def abort(self) -> None:
        self.hang_up(None)

    def hang_up(self, exc: Exception | None) -> None:
        """The connection ends: by close() or abort(), or the peer's reset (`exc`)."""
        if not self.closing:
            self.closing = True
            self._loop.call_soon(self._lose, exc)

    def _lose(self, exc: Exception | None) -> None:
        if not self.lost:
            self.lost = True
            self._protocol.connection_lost(exc)

    def receive_eof(self) -> None:
        """The peer ended its side; a protocol that does not keep it open gets closed."""
        if not self._protocol.eof_received():
            self.close()

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading and not self.closing

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("192.0.2.1", 40000), "sockname": ("192.0.2.2", 8080)}.get(
            name, default
        )

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]


def deliver(call: Callable[[], object], what: str) -> None:
    """A protocol callback, as a transport calls it: whatever escapes it is a bug (asyncio
    would log it as a fatal error and drop the connection)."""
    try:
        call()
    except Violation:
        raise
    except BaseException as exc:
        raise Violation("escape", f"{what} raised {exc!r}") from exc


class LogRecorder(logging.Handler):
    """The records a logger emits during one input."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        logger = logging.getLogger(name)
        logger.addHandler(self)
        logger.propagate = False
        logger.setLevel(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
