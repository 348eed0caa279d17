"""The terms of one exchange with a replica over HTTP/1.1: the bounds of an answer's head, and
the errors an exchange ends with."""

from __future__ import annotations

from dataclasses import dataclass


class ExchangeError(Exception):
    """An exchange failed; the message says how, for the log and the client's error."""


class ConnectFailed(ExchangeError):
    """No connection could be made: the request certainly never reached the replica."""


class Broken(ExchangeError):
    """The connection closed or failed before the answer ended."""

    def __init__(self, message: str, *, answered: bool) -> None:
        super().__init__(message)
        # Whether any byte of an answer arrived: without one, a request sent on a reused
        # connection may have met the replica closing it while idle.
        self.answered = answered


class DeadlineExceeded(ExchangeError):
    """The exchange's deadline passed before the answer ended."""


class TooLarge(ExchangeError):
    """An answer read whole grew past the caller's limit."""


class Malformed(ExchangeError):
    """The answer is not HTTP/1.1 that taskgate can read."""


class HeadTooLarge(Malformed):
    """The answer's head passed its limits (a line's bytes, the field count, or the whole head
    while it never ends): a replica must not make taskgate hold what it pleases."""


@dataclass(frozen=True, slots=True)
class HeadLimits:
    """Bounds of an answer's head; a replica's, by default the listener's own."""

    max_header_bytes: int = 8190
    max_headers: int = 100
    max_head_bytes: int = 64 * 1024

    @property
    def head_bound(self) -> int:
        """All bytes before the final head ends, interim answers included: the whole head,
        or one line if that is larger."""
        return max(self.max_head_bytes, self.max_header_bytes)


class HeadBounds:
    """An answer's head kept within its HeadLimits as it arrives, interim answers included:
    each header line and the field count, the lines in all (a chunked body's trailers too),
    the bytes fed before the final head ended, and, after it, bytes that carry no body."""

    __slots__ = ("_bound", "_fed", "_idle", "_lines", "_max_fields", "_max_line")

    def __init__(self, limits: HeadLimits) -> None:
        self._max_line = limits.max_header_bytes
        self._max_fields = limits.max_headers
        self._bound = limits.head_bound
        self.reset()

    def reset(self) -> None:
        self._fed = 0  # received before the final head ended (interim answers included)
        self._lines = 0  # header lines parsed so far (interim answers included)
        self._idle = 0  # received since the head ended without a byte of body

    def header(self, name: bytes, value: bytes, fields: int) -> None:
        """One more header line, after `fields` of them; HeadTooLarge past the limits."""
        line = len(name) + len(value) + 2
        if line > self._max_line:
            raise HeadTooLarge(f"a header line of the answer is over {self._max_line} bytes")
        if fields >= self._max_fields:
            raise HeadTooLarge(f"the answer has more than {self._max_fields} header fields")
        self._lines += line + 2
        if self._lines > self._bound:
            raise HeadTooLarge(f"the answer's head is larger than {self._bound} bytes")

    def trailer(self, name: bytes, value: bytes) -> None:
        if len(name) + len(value) + 2 > self._max_line:
            limit = self._max_line
            raise HeadTooLarge(f"a trailer line of the answer is over {limit} bytes")
        self._lines += len(name) + len(value) + 4
        if self._lines > self._bound:
            limit = self._bound
            raise HeadTooLarge(f"the answer's head and trailers are larger than {limit} bytes")

    def head_fed(self, size: int) -> HeadTooLarge | None:
        """`size` bytes fed while the head has not ended: httptools gathers a header line whole
        before handing it over, so this bounds what a replica can make taskgate hold while its
        head never ends."""
        self._fed += size
        if self._fed > self._bound:
            return HeadTooLarge(f"the answer's head is larger than {self._bound} bytes")
        return None

    def body_fed(self, size: int, body: bool) -> HeadTooLarge | None:
        """`size` bytes fed after the head, `body` whether any of them was body. The same bound
        for trailers: bytes that carry no body for longer than a head may be long are not an
        answer."""
        self._idle = 0 if body else self._idle + size
        if self._idle > self._bound:
            return HeadTooLarge(f"the answer sent {self._bound} bytes that are not its body")
        return None


def header_value(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first value of a header (`name` lower-case) among `headers` as an answer's head
    holds them, decoded as latin-1, or None."""
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None
