"""taskgate's log output, its own lines and the request log's, in one format (text with UTC times,
or one JSON object per line), written to standard error by a bounded writer that never blocks."""

from __future__ import annotations

import atexit
import logging
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable

import orjson

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"
DROPPED = (
    "%d log lines dropped: standard error was not read fast enough (logging.max_pending_bytes)"
)


class JSONFormatter(logging.Formatter):
    """time, level, logger, pid and message; the traceback as `exception` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


class LogWriter:
    """Whole lines for one file descriptor, written by a thread of its own behind a queue of at
    most `max_bytes`: a line that does not fit is dropped and counted, never waited for, and a
    line saying how many were dropped takes their place in the output, written once the writer
    gets that far.

    Why a thread and not the fd in non-blocking mode: standard error's open file description is
    shared with the parent, the supervisor and the other workers, and O_NONBLOCK on it would
    make their writes (and Python's own to sys.stderr) fail with EAGAIN. The thread may block on
    a pipe nobody reads; whoever writes only ever appends to the queue, under a lock the thread
    never holds while writing.
    """

    def __init__(self, fd: int, *, max_bytes: int, notice: Callable[[int], str]) -> None:
        self._fd = fd
        self._max = max_bytes
        self._notice = notice
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # Whole lines as bytes; an int stands where that many lines were dropped.
        self._queue: deque[bytes | int] = deque()
        self._pending = 0  # bytes queued or being written: what max_bytes bounds
        self._closing = False
        self.dropped = 0  # lines dropped since the start, for /metrics
        self._thread = threading.Thread(target=self._run, name="taskgate-log-writer", daemon=True)
        self._thread.start()

    def write(self, text: str) -> None:
        """Queue `text`, whole lines each ending in a newline: as many of them as fit."""
        data = text.encode("utf-8", "backslashreplace")
        with self._lock:
            room = self._max - self._pending
            if self._closing:
                room = 0
            cut = len(data)
            if cut > room:
                cut = data.rfind(b"\n", 0, room) + 1  # the lines that fit whole, maybe none
            if cut:
                self._queue.append(data[:cut] if cut < len(data) else data)
                self._pending += cut
                self._wake.notify()
            if cut < len(data):
                self._drop(data.count(b"\n", cut) or 1)

    @property
    def pending(self) -> int:
        """Bytes queued or being written."""
        with self._lock:
            return self._pending

    def _drop(self, lines: int) -> None:
        self.dropped += lines
        if self._closing:
            return  # counted; no notice can follow once the writer stops
        if self._queue and isinstance(self._queue[-1], int):
            self._queue[-1] += lines
        else:
            self._queue.append(lines)

    def close(self, timeout_s: float) -> bool:
        """Write what is pending, waiting at most `timeout_s`; False when some was left (the
        reader of standard error is gone or stuck). Lines written after this are dropped."""
        with self._lock:
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._wake.wait()
                if not self._queue:
                    return
                batch = list(self._queue)
                self._queue.clear()
            written = lost = 0
            for entry in batch:
                if isinstance(entry, int):
                    self._write_all(self._notice(entry).encode("utf-8", "backslashreplace"))
                    continue
                if not self._write_all(entry):
                    lost += entry.count(b"\n")
                written += len(entry)
            with self._lock:
                self._pending -= written
                self.dropped += lost

    def _write_all(self, data: bytes) -> bool:
        """Write `data` whole, however long it takes; False when the fd is closed."""
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._fd, view) :]
            except BlockingIOError:  # another process made the description non-blocking
                select.select([], [self._fd], [])
            except OSError:  # standard error is closed (EPIPE, EBADF): nothing more goes out
                return False
        return True


class WriterHandler(logging.Handler):
    """The root logger's handler: each record formatted, then queued on the writer."""

    def __init__(self, writer: LogWriter) -> None:
        super().__init__()
        self.writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record) + "\n"
        except Exception:  # logging's own convention (StreamHandler): report, never raise
            self.handleError(record)
            return
        self.writer.write(text)


def writer() -> LogWriter | None:
    """The writer of the root logger's handler, which configure() installed and the request log
    shares; None without one (tests that capture sys.stderr)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, WriterHandler):
            return handler.writer
    return None


def dropped_lines() -> int:
    """Log lines this process dropped: taskgate_log_lines_dropped_total."""
    current = writer()
    return current.dropped if current is not None else 0


def configure(
    level: str,
    *,
    json: bool,
    max_pending_bytes: int = 4 * 1024 * 1024,
    flush_timeout_s: float = 2.0,
) -> None:
    """The root logger's one handler, on standard error through a LogWriter that the request log
    shares; UTC times in both formats, as the request log has them. What is pending at exit is
    written, waiting at most `flush_timeout_s`."""
    formatter: logging.Formatter
    if json:
        formatter = JSONFormatter()
    else:
        formatter = logging.Formatter(TEXT_FORMAT)
        formatter.converter = time.gmtime

    def notice(lines: int) -> str:
        record = logging.LogRecord(
            "taskgate.logs", logging.WARNING, __file__, 0, DROPPED, (lines,), None
        )
        return formatter.format(record) + "\n"

    previous = writer()
    if previous is not None:
        previous.close(flush_timeout_s)
    current = LogWriter(2, max_bytes=max_pending_bytes, notice=notice)
    atexit.register(current.close, flush_timeout_s)
    handler = WriterHandler(current)
    handler.setFormatter(formatter)
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
