"""The public listener's bounds: what one request, one connection and the process may hold
(`Limits`), the refusal a request gets past one (`Refused`), the count of request bytes held
against the process's budget (`RequestBytes`), and the sizes the server reads and writes in."""

from __future__ import annotations

from dataclasses import dataclass

# Requests parsed ahead of the one being answered: one, as uvicorn and aiohttp read ahead. The
# bytes after it stay unparsed (at most one read, READ_SIZE) and reading pauses.
PIPELINE_DEPTH = 1
# The most one read from a socket brings (asyncio's selector transports and uvloop alike).
READ_SIZE = 256 * 1024
# The transport's write buffer: past HIGH, pause_writing (nothing more is read or started);
# resume_writing once it is empty, rather than at asyncio's 16 KiB, so that the unsent bytes the
# answer budget counts are looked at again when they reach 0 (the transport says nothing of
# them in between). The kernel's socket buffer keeps the client fed meanwhile.
WRITE_HIGH_WATER = 64 * 1024
WRITE_LOW_WATER = 0
# A larger body is written in pieces of this size. Under uvloop the unsent rest of one write
# keeps the whole written object alive; in pieces, what the transport keeps is within a piece
# of what it reports unsent, which is what the answer budget counts.
WRITE_PIECE = 256 * 1024
OVER_BUDGET = "Service unavailable: taskgate holds as many request bytes as it may; retry"


@dataclass(frozen=True, slots=True)
class Limits:
    max_header_bytes: int = 8190
    max_headers: int = 100
    max_body_bytes: int = 4 * 1024 * 1024
    read_timeout_s: float = 10.0
    keepalive_timeout_s: float = 75.0
    max_connections: int = 10_000
    max_buffered_bytes: int = 128 * 1024 * 1024
    max_requests_per_connection: int | None = None
    max_head_bytes: int | None = None

    @property
    def head_bound(self) -> int:
        """The bytes of one request head, request line included (431 past it); also what a
        head may make the server hold while it never ends a line."""
        if self.max_head_bytes is not None:
            return self.max_head_bytes
        return self.max_header_bytes * (self.max_headers + 2)


class Refused(Exception):
    """The server refuses the request with this status; `reason` is for the client. A 503 is
    retryable: the client may send the same request again shortly."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def too_large(limit: int) -> Refused:
    return Refused(413, f"Payload too large: the limit is {limit} bytes")


class RequestBytes:
    """The request bytes a server's connections hold (bodies read, pipelined bytes waiting),
    one count over all of them, against `most` (Limits.max_buffered_bytes)."""

    __slots__ = ("held", "most")

    def __init__(self, most: int) -> None:
        self.most = most
        self.held = 0
