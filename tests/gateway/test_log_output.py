"""taskgate's log output never stops taskgate: a reader of standard error that stops reading
costs dropped, counted lines, announced once writing resumes, and never a request (issue 24,
item 3). The writer over a real pipe, then a real `taskgate run` whose stderr nobody reads."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import orjson

from gateway.observe.logs import LogWriter
from tests.gateway.test_cli import ROOT
from tests.gateway.test_observability import scrape, value
from tests.support.mcp import mcp_post, poll_until
from tests.support.procs import BackendProcess, free_ports

DROPPED = re.compile(r"(\d+) log lines dropped")
PIPE_WAIT_S = 30  # a bound on what would hang on the broken code


def announced(text: str) -> int:
    """How many dropped lines the notices in `text` count."""
    return sum(int(n) for n in DROPPED.findall(text))


def notice(lines: int) -> str:
    return f"{lines} log lines dropped\n"


class Drain:
    """Reads a pipe to its end on a thread, from when it is started."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.data = bytearray()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Drain:
        self._thread.start()
        return self

    def _run(self) -> None:
        while chunk := os.read(self._fd, 65536):
            self.data += chunk

    def join(self) -> str:
        self._thread.join(PIPE_WAIT_S)
        assert not self._thread.is_alive(), "the pipe never reached its end"
        return self.data.decode()

    def text(self) -> str:
        return bytes(self.data).decode(errors="replace")


def wait_until(condition: Callable[[], bool]) -> None:
    """Poll `condition` from a plain function (these tests have no event loop)."""
    deadline = time.monotonic() + PIPE_WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def in_thread(work: threading.Thread) -> None:
    work.start()
    work.join(PIPE_WAIT_S)
    assert not work.is_alive(), "writing to the log writer blocked"


# --- the writer over a real pipe ------------------------------------------------------------


def test_a_pipe_nobody_reads_never_blocks_a_write_and_the_drops_are_announced() -> None:
    read_end, write_end = os.pipe()
    writer = LogWriter(write_end, max_bytes=16 * 1024, notice=notice)
    lines = [f"line {n:05d} " + "x" * 90 + "\n" for n in range(10_000)]  # ~1 MB, pipe 64 KiB

    def write_all() -> None:
        for line in lines:
            writer.write(line)

    in_thread(threading.Thread(target=write_all))
    assert writer.dropped > 0

    drain = Drain(read_end).start()
    assert writer.close(PIPE_WAIT_S)
    os.close(write_end)
    out = drain.join()
    os.close(read_end)
    kept = [line for line in out.splitlines() if line.startswith("line ")]
    announced = [int(n) for n in DROPPED.findall(out)]
    # every line is either written whole, in order, or counted in a notice where it was
    assert len(kept) + sum(announced) == len(lines)
    assert sum(announced) == writer.dropped
    assert kept == sorted(kept)
    assert all(len(line) == 101 for line in kept)
    first_gap = out.splitlines().index(f"{announced[0]} log lines dropped")
    assert out.splitlines()[first_gap - 1] == lines[first_gap - 1].rstrip("\n")


def fill(fd: int) -> None:
    """Fill the pipe behind `fd` with empty lines, as a reader that stopped reading leaves it."""
    os.set_blocking(fd, False)
    for size in (4096, 1):  # a write of up to PIPE_BUF bytes goes whole or not at all
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(fd, b"\n" * size)
    os.set_blocking(fd, True)


def test_a_batch_that_does_not_fit_keeps_the_whole_lines_that_do() -> None:
    read_end, write_end = os.pipe()
    writer = LogWriter(write_end, max_bytes=100, notice=notice)
    try:
        fill(write_end)
        writer.write("p" * 59 + "\n")  # queued or being written: 60 of 100 bytes pending
        writer.write("a" * 20 + "\n" + "c" * 20 + "\n")  # the first fits, the second not
        writer.write("d" * 30 + "\n")  # nothing fits
        writer.write("b" * 200 + "\n")  # more than the whole bound: dropped, never waited for
        assert writer.dropped == 3

        drain = Drain(read_end).start()
        wait_until(lambda: writer.pending == 0)  # written: there is room again
        writer.write("e" * 30 + "\n")
        assert writer.close(PIPE_WAIT_S)
        os.close(write_end)
        out = [line for line in drain.join().splitlines() if line]
    finally:
        os.close(read_end)
    assert out == ["p" * 59, "a" * 20, "3 log lines dropped", "e" * 30]


def test_closing_waits_a_bounded_time_for_a_reader_that_never_reads() -> None:
    read_end, write_end = os.pipe()
    writer = LogWriter(write_end, max_bytes=1024 * 1024, notice=notice)
    try:
        writer.write("z" * 200_000 + "\n")  # more than the pipe holds
        assert writer.close(0.2) is False  # the thread is still writing: given up on
        writer.write("after\n")
        assert writer.dropped == 1  # what comes after close is dropped, not queued
    finally:
        os.close(read_end)  # the stuck write fails (EPIPE) and the thread ends
        assert writer.close(PIPE_WAIT_S)
        os.close(write_end)
    assert writer.dropped == 2  # and the line it could not write is counted too


# --- a real `taskgate run` whose standard error nobody reads --------------------------------


@contextlib.contextmanager
def unread_taskgate(config: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`taskgate run` with stdout and stderr pipes this test does not read until it says so."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "run", "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


async def test_taskgate_answers_every_request_while_nobody_reads_its_log(
    tmp_path: Path, r1: BackendProcess
) -> None:
    port, admin = free_ports(2)
    path = tmp_path / "taskgate.yaml"
    path.write_text(
        f"listen: {{host: 127.0.0.1, port: {port}}}\n"
        f"admin: {{host: 127.0.0.1, port: {admin}}}\n"
        "logging: {format: json, access: true, max_pending_bytes: 65536}\n"
        f"backends:\n  reports: {{replicas: ['{r1.url}']}}\n"
        "routes:\n  - {tools: ['*'], backend: reports}\n"
    )
    admin_url = f"http://127.0.0.1:{admin}"
    url = f"http://127.0.0.1:{port}/mcp"
    params = {"name": "echo", "arguments": {"text": "hi"}}
    calls = 2_000
    with unread_taskgate(path) as proc:
        assert proc.stderr is not None
        assert proc.stdout is not None
        timeout = aiohttp.ClientTimeout(total=PIPE_WAIT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:

            async def up() -> bool:
                try:
                    async with http.get(f"{admin_url}/healthz") as response:
                        return response.status == 200
                except aiohttp.ClientConnectionError:
                    return False

            await poll_until(up, bool, within=60)
            statuses: list[int] = []

            async def client(ids: range) -> None:
                for n in ids:
                    status, answer = await mcp_post(http, url, "tools/call", params, id=n)
                    assert answer["result"]["content"][0]["text"].startswith("hi")
                    statuses.append(status)

            clients = [client(range(k, calls, 8)) for k in range(8)]
            try:
                async with asyncio.timeout(PIPE_WAIT_S * 4):
                    await asyncio.gather(*clients)
            except TimeoutError:
                raise AssertionError(
                    f"taskgate stopped answering after {len(statuses)} of {calls} calls: its "
                    "log output blocked it"
                ) from None
            assert statuses == [200] * calls
            _, samples = await scrape(http, admin_url)
            assert value(samples, "taskgate_log_lines_dropped_total") > 0

            # Now read standard error: once taskgate can write again it says what it dropped.
            drain = Drain(proc.stderr.fileno()).start()

            async def written() -> str:
                return drain.text()

            await poll_until(written, lambda text: announced(text) > 0, within=PIPE_WAIT_S)
            _, samples = await scrape(http, admin_url)
            dropped = value(samples, "taskgate_log_lines_dropped_total")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=PIPE_WAIT_S) == 0
        err = drain.join()
    lines = [orjson.loads(line) for line in err.splitlines()]  # every line whole, JSON
    notices = [line for line in lines if announced(line.get("message", ""))]
    assert {(line["logger"], line["level"]) for line in notices} == {("taskgate.logs", "warning")}
    assert sum(announced(line["message"]) for line in notices) == dropped
    access = [line for line in lines if line["logger"] == "taskgate.access"]
    assert len(access) + dropped >= calls  # what was not written was counted
    assert len(access) < calls
