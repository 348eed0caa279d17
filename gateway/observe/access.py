"""Request logs: one line per request, text (key=value) or JSON, written in batches.

Lines are buffered and written together FLUSH_S after the first of them, or at once when
FLUSH_LINES are waiting, as nginx's `access_log ... buffer= flush=` does: a write per request
(or a logging.Handler per line: a lock, a LogRecord, a formatter) cost 10-20% of a `tasks/get`.
The price: a crash loses at most FLUSH_S of lines; a stop flushes them. A batch goes to the
process's log writer (gateway/observe/logs.py), which never blocks: a reader of standard error
that stops reading costs dropped, counted lines, not requests.

The task id is never written as sent: its hash (task_hash) is, which `taskgate task inspect`
prints too, so an operator can find a task's lines without the log holding ids that would let
a reader of the log use them.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import time
from typing import TextIO

import orjson

from gateway.observe.exchange import Exchange
from gateway.observe.logs import writer

# The stable field list, in order (docs/operations.md, "Request logs").
FIELDS = (
    "time",
    "method",
    "status",
    "rpc_code",
    "backend",
    "replica",
    "duration_ms",
    "upstream_ms",
    "tenant",
    "task",
    "trace_id",
    "limit",
)


def task_hash(task_id: str) -> str:
    """The task id as logs show it: 12 hex digits of its BLAKE2b hash. Polled tasks come back
    again and again: the last HASHES_KEPT hashes are remembered (a third of a log line's cost)."""
    digest = _hashes.get(task_id)
    if digest is None:
        if len(_hashes) >= HASHES_KEPT:
            _hashes.clear()
        digest = _hashes[task_id] = _digest(task_id)
    return digest


def logged_task_hash(exchange: Exchange) -> str:
    """The task hash a request's record shows ("" without a task id). Only a task whose route
    was found (a backend is named) goes through the memo; an id that was not found is hashed
    afresh every time. Else another owner's id, kept in the memo by its owner's polls, would be
    refused about 1 us faster than an id never seen (THREAT_MODEL.md)."""
    task_id = exchange.task_id
    if task_id is None:
        return ""
    return task_hash(task_id) if exchange.backend else _digest(task_id)


def _digest(task_id: str) -> str:
    return hashlib.blake2b(task_id.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()


HASHES_KEPT = 4096
_hashes: dict[str, str] = {}


FLUSH_S = 0.2
FLUSH_LINES = 512


class AccessLog:
    __slots__ = ("_json", "_lines", "_pid", "_second", "_stamp", "_stream", "_timer")

    def __init__(self, *, json: bool, stream: TextIO | None = None) -> None:
        self._json = json
        # None: the process's log writer, or without one sys.stderr as it is when written
        # (test capture swaps it)
        self._stream = stream
        self._lines: list[str] = []
        self._pid = os.getpid()
        self._second = -1
        self._stamp = ""
        self._timer: asyncio.TimerHandle | None = None

    def write(self, exchange: Exchange, status: int, code: int | None, seconds: float) -> None:
        now = time.time()
        second = int(now)
        if second != self._second:  # strftime once a second, not once a line
            self._second = second
            self._stamp = time.strftime(
                "%Y-%m-%dT%H:%M:%S" if self._json else "%Y-%m-%d %H:%M:%S", time.gmtime(second)
            )
        millis = int((now - second) * 1000)
        task = logged_task_hash(exchange)
        upstream_ms = round(exchange.upstream_s * 1000, 3) if exchange.upstream_s >= 0 else None
        if self._json:
            line = orjson.dumps(
                {
                    "time": f"{self._stamp}.{millis:03d}Z",
                    "level": "info",
                    "logger": "taskgate.access",
                    "method": exchange.method,
                    "status": status,
                    "rpc_code": code,
                    "backend": exchange.backend or None,
                    "replica": exchange.replica or None,
                    "duration_ms": round(seconds * 1000, 3),
                    "upstream_ms": upstream_ms,
                    "tenant": exchange.tenant or None,
                    "task": task or None,
                    "trace_id": exchange.trace_id or None,
                    "limit": exchange.limit or None,
                }
            ).decode()
        else:
            line = (
                f"{self._stamp},{millis:03d} INFO taskgate.access [{self._pid}] "
                f"method={exchange.method} status={status} rpc_code={_text(code)} "
                f"backend={exchange.backend or '-'} replica={exchange.replica or '-'} "
                f"duration_ms={seconds * 1000:.3f} "
                f"upstream_ms={'-' if upstream_ms is None else f'{upstream_ms:.3f}'} "
                f"tenant={_word(exchange.tenant)} task={task or '-'} "
                f"trace_id={exchange.trace_id or '-'} limit={exchange.limit or '-'}"
            )
        lines = self._lines
        lines.append(line)
        if len(lines) >= FLUSH_LINES:
            self.flush()
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(FLUSH_S, self.flush)
            except RuntimeError:  # no loop (a unit test): write now
                self.flush()

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._lines:
            return
        text = "\n".join(self._lines) + "\n"
        self._lines.clear()
        if self._stream is None and (shared := writer()) is not None:
            shared.write(text)
            return
        stream = self._stream if self._stream is not None else sys.stderr
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):  # a closed stderr must not fail requests
            pass


def _text(code: int | None) -> str:
    return "-" if code is None else str(code)


def _word(value: str) -> str:
    """A value as one key=value word: a tenant claim with spaces or quotes is quoted."""
    if not value:
        return "-"
    if value.isprintable() and not any(c in value for c in ' "='):
        return value
    return orjson.dumps(value).decode()
