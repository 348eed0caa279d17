"""The bytes of HTTP/1.1 the server reads and writes: a request's target and Host, an answer's
status line, Date and header lines, a large body in pieces, and how a handler's task starts."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import httptools

from gateway.h1.headers import BadHeaderValue
from gateway.h1.limits import WRITE_PIECE, Refused

HEAD_END = b"\r\n\r\n"
# RFC 9112 3.2 / RFC 3986 3.2.2-3.2.3: a Host value is an authority without userinfo.
_HOST = re.compile(rb"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~!$&'()*+,;=%-]*)(?::[0-9]*)?")


def header_lines(headers: dict[str, str], content_type: str | None) -> bytes:
    """An answer's header lines (Date and framing apart); BadHeaderValue if a name or value would
    carry CR, LF or NUL, or is not latin-1 text. Printable text is safe at a glance; only what
    is not (a tab, say) is looked at closely."""
    lines = []
    if content_type is not None:
        if not content_type.isprintable():
            _check(content_type)
        lines.append(f"Content-Type: {content_type}\r\n")
    for key, value in headers.items():
        if not (key.isprintable() and value.isprintable()):
            _check(key)
            _check(value)
        lines.append(f"{key}: {value}\r\n")
    try:
        return "".join(lines).encode("latin-1")
    except UnicodeEncodeError:
        raise BadHeaderValue("a header is not latin-1 text") from None


def _check(text: str) -> None:
    if "\r" in text or "\n" in text or "\0" in text:
        raise BadHeaderValue("a header name or value holds CR, LF or NUL")


# Host values repeat from request to request: each is judged once; the bound keeps odd clients
# from growing the memo.
KNOWN_HOSTS: dict[bytes, bool] = {}


def host_ok(value: bytes) -> bool:
    verdict = KNOWN_HOSTS.get(value)
    if verdict is None:
        verdict = _HOST.fullmatch(value.strip(b" \t")) is not None
        if len(KNOWN_HOSTS) < 256:
            KNOWN_HOSTS[value] = verdict
    return verdict


def write_pieces(transport: asyncio.Transport, body: bytes) -> None:
    """The rest of a large body after its first piece, unless the client leaves meanwhile."""
    for start in range(WRITE_PIECE, len(body), WRITE_PIECE):
        if transport.is_closing():
            return
        transport.write(body[start : start + WRITE_PIECE])


def parse_reason(exc: Exception) -> str:
    """httptools wraps llhttp's reason (e.g. 'Duplicate Content-Length'); name it plainly."""
    text = str(exc).strip() or type(exc).__name__
    return text.rstrip(".")


def target_path(url: bytes) -> str:
    try:
        path = httptools.parse_url(url).path or b"/"
    except httptools.HttpParserInvalidURLError:
        raise Refused(400, "Bad request: the request target is not a URL") from None
    text = path.decode("latin-1")
    return unquote(text) if "%" in text else text


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        line = f"HTTP/1.1 {status} {phrase}\r\n".encode("latin-1")
    return line


_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}

# The Date header (RFC 9110 6.6.1), formatted once a second rather than once an answer.
_date_second = 0
_date_value = b""


def http_date() -> bytes:
    global _date_second, _date_value
    now = int(time.time())
    if now != _date_second:
        _date_second = now
        _date_value = formatdate(now, usegmt=True).encode("ascii")
    return _date_value


def later_task(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task[None]:
    return loop.create_task(coro)


def eager_task(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task[None]:
    # From 3.12 a task can run its first step at once, saving a trip round the loop per
    # request, as aiohttp's server does there; before that, the ordinary way.
    if sys.version_info >= (3, 12):
        return asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg,unused-ignore]
    return loop.create_task(coro)
