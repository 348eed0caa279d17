"""Incremental SSE decoder that keeps each event's raw bytes, the reader of a request's answer
in a stream, and an encoder."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class Frame:
    """One SSE block up to and including its blank line; `raw` is relayed as received."""

    raw: bytes
    event: str | None
    data: str | None  # the data lines joined with "\n"; None for comment-only blocks
    id: str | None = None  # its `id` field: the event to resume after (Last-Event-ID)
    retry: int | None = None  # its `retry` field: how long to wait before resuming (ms)


class FrameTooLarge(Exception):
    """A block grew past the decoder's bound without ending."""


class SSEDecoder:
    """Split a byte stream into frames at blank lines (any of CRLF, LF, CR line ends)."""

    def __init__(self, max_frame_bytes: int = 4 * 1024 * 1024) -> None:
        self._buffer = bytearray()
        self._scan = 0  # where the next unread line starts
        self._max = max_frame_bytes

    def feed(self, chunk: bytes) -> list[Frame]:
        self._buffer += chunk
        frames: list[Frame] = []
        start = 0  # start of the current frame in the buffer
        pos = self._scan
        buf = self._buffer
        while True:
            end, next_pos = _line_end(buf, pos)
            if end < 0:
                break
            if end == pos:  # a blank line ends the frame
                if next_pos - start > self._max:  # the bound must not depend on chunking
                    raise FrameTooLarge(f"an SSE event exceeded {self._max} bytes")
                frames.append(_frame(bytes(buf[start:next_pos])))
                start = next_pos
            pos = next_pos
        del buf[:start]
        self._scan = pos - start
        if len(buf) > self._max:
            raise FrameTooLarge(f"an SSE event exceeded {self._max} bytes")
        return frames

    def pending(self) -> bytes:
        """Bytes of an unfinished frame (relayed as they are if the stream ends early)."""
        return bytes(self._buffer)


class AnswerReader:
    """The answer to one request among the events of a stream, fed chunk by chunk: the message
    that carries the request's id and no method. The server's own requests and notifications
    before it, and events that are not JSON, are passed over. FrameTooLarge from feed when an
    event grows past `max_frame_bytes`: a server must not make taskgate hold what it pleases."""

    __slots__ = ("_decoder", "_id")

    def __init__(self, request_id: object, max_frame_bytes: int = 4 * 1024 * 1024) -> None:
        self._decoder = SSEDecoder(max_frame_bytes)
        self._id = request_id

    def feed(self, chunk: bytes) -> tuple[dict[str, Any], str] | None:
        """The answer (parsed, and its data as sent) once `chunk` completes it, else None."""
        for frame in self._decoder.feed(chunk):
            data = frame.data
            if data is None:
                continue
            try:
                message = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if (
                isinstance(message, dict)
                and message.get("id") == self._id
                and "method" not in message
            ):
                return message, data
        return None


def _line_end(buf: bytearray, pos: int) -> tuple[int, int]:
    """(end of the line at pos, start of the next), or (-1, pos) if the line is incomplete."""
    lf = buf.find(b"\n", pos)
    cr = buf.find(b"\r", pos, lf if lf >= 0 else len(buf))
    if cr < 0:
        return (lf, lf + 1) if lf >= 0 else (-1, pos)
    if cr + 1 == len(buf):
        return -1, pos  # a CR at the end may be half of a CRLF
    return cr, cr + 2 if buf[cr + 1] == 0x0A else cr + 1


def _frame(raw: bytes) -> Frame:
    event: str | None = None
    event_id: str | None = None
    retry: int | None = None
    data: list[str] = []
    for line in raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        field, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data.append(value.decode("utf-8", "replace"))
        elif field == b"event":
            event = value.decode("utf-8", "replace")
        elif field == b"id" and b"\0" not in value:  # one with NUL is ignored (WHATWG SSE)
            event_id = value.decode("utf-8", "replace")
        elif field == b"retry" and value.isdigit() and len(value) < 10:
            retry = int(value)
    joined = "\n".join(data) if data else None
    return Frame(raw=raw, event=event, data=joined, id=event_id, retry=retry)


def encode_event(data: str, *, event: str | None = None) -> bytes:
    """One SSE event carrying `data` (split over data lines where it has line breaks)."""
    if event is not None and _LINE_BREAK.search(event):
        raise ValueError("an SSE event name cannot contain a line break")
    lines = [f"event: {event}"] if event else []
    # Only CRLF, LF and CR end an SSE line; str.splitlines() would also split on U+2028,
    # U+0085, form feeds and more, which JSON carries raw inside strings.
    lines.extend(f"data: {line}" for line in _LINE_BREAK.split(data))
    return ("\n".join(lines) + "\n\n").encode()
