"""Persistent HTTP/1.1 connections per replica origin, for every call taskgate makes to a
replica: the relay's POSTs, its own calls (gateway/upstream/calls.py), the upstream listens and
the 2025-era sessions' DELETEs."""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from typing import Final
from urllib.parse import quote, urlsplit

from gateway.h1.answers import AnswerBudget
from gateway.upstream.connection import Connection, UpstreamResponse
from gateway.upstream.framing import Broken, ConnectFailed, DeadlineExceeded, HeadLimits

# Idle connections are reused most-recent first and dropped after this long: under the
# keep-alive timeout of common servers (uvicorn's is 5 s), so taskgate rarely sends on a
# connection the replica is closing at that moment.
IDLE_TIMEOUT_S = 4.0
# Connecting is quick or it is not happening; a slow connect must not eat a call's deadline.
CONNECT_TIMEOUT_S = 3.0
MAX_IDLE_PER_ORIGIN = 256
_DEFAULT_LIMITS = HeadLimits()
# The answer budget of a pool built without one: listen.max_answer_buffer_bytes and
# listen.max_connections by default.
DEFAULT_ANSWER_BUFFER_BYTES = 1024 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 10_000


class Origin:
    """Where a replica URL's requests go, and the first bytes of every request to it.

    The key of the idle connections, looked up twice a request: its hash is computed once
    (a dataclass's generated __hash__ stays interpreted Python when compiled, and hashed the
    limits too, each time). Equal fields are the same origin, so the idle connections of a
    replica whose limits were set again with the same values are still found."""

    __slots__ = ("_fields", "_hash", "host", "limits", "port", "prefix", "target", "tls")

    def __init__(self, host: str, port: int, tls: bool, target: bytes, limits: HeadLimits) -> None:
        self.host: Final = host
        self.port: Final = port
        self.tls: Final = tls
        self.target: Final = target  # " <path> HTTP/1.1" and the Host header, after the method
        self.prefix: Final = b"POST" + target  # built once: nearly every request is a POST
        self.limits: Final = limits
        self._fields: Final = (host, port, tls, target, limits)
        self._hash: Final = hash(self._fields)

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Origin) and self._fields == other._fields)

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def of(cls, url: str, limits: HeadLimits | None = None) -> Origin:
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        host = parts.hostname or ""
        port = parts.port or (443 if tls else 80)
        # Percent-encoded as a request target must be; Host never carries userinfo.
        path = quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")
        authority = parts.netloc.rpartition("@")[2]
        target = f" {path} HTTP/1.1\r\nHost: {authority}\r\n".encode("ascii")
        return cls(host, port, tls, target, limits if limits is not None else _DEFAULT_LIMITS)


class Pool:
    """Connections by origin; `post` (or `bodiless`) sends one request and returns the head of
    its answer.

    The caller reads or closes the UpstreamResponse; a connection read to its end comes back here.
    Nothing bounds the number of open connections but the callers: the coordinator's in-flight
    limits do that. `answers` is the process's budget of answer bytes held for clients, which
    the relay charges each answer it reads against (gateway/h1/answers.py).
    """

    def __init__(
        self,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        limits: HeadLimits | None = None,
        answers: AnswerBudget | None = None,
    ) -> None:
        self.answers = answers or AnswerBudget(DEFAULT_ANSWER_BUFFER_BYTES, DEFAULT_MAX_CONNECTIONS)
        self._connect_timeout_s = connect_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._limits = limits or HeadLimits()
        self._limits_by_url: dict[str, HeadLimits] = {}
        self._idle: dict[Origin, deque[Connection]] = {}
        self._origins: dict[str, Origin] = {}
        self._owners: dict[Connection, Origin] = {}
        self._tls: ssl.SSLContext | None = None
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def now(self) -> float:
        """The loop's time, in which deadlines are set. The loop is looked up once: on Python
        3.11 each asyncio.get_running_loop() costs a getpid() system call, three a request."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        return loop.time()

    def limit(self, url: str, limits: HeadLimits) -> None:
        """Bound the answers of the replica at `url` otherwise than the pool's default."""
        self._limits_by_url[url] = limits
        self._origins.pop(url, None)

    def origin(self, url: str) -> Origin:
        origin = self._origins.get(url)
        if origin is None:
            limits = self._limits_by_url.get(url, self._limits)
            origin = self._origins[url] = Origin.of(url, limits)
        return origin

    async def post(
        self, url: str, headers: bytes, body: bytes, *, deadline: float | None, idempotent: bool
    ) -> UpstreamResponse:
        """POST `body` with `headers` (complete lines, CRLF-terminated) to `url`; `deadline`
        (loop time) bounds connecting, sending and the whole answer (DeadlineExceeded); None
        leaves the answer unbounded in time (an upstream listen: its reader ends it).

        A reused connection that breaks before any answer may have been closed by the replica
        while idle; an idempotent request is then sent once more on a fresh connection. A
        non-idempotent one is not: the replica may have acted on it.
        """
        origin = self.origin(url)
        data = b"%s%sContent-Length: %d\r\n\r\n%s" % (origin.prefix, headers, len(body), body)
        return await self._exchange(origin, data, deadline, idempotent)

    async def bodiless(
        self, method: bytes, url: str, headers: bytes, *, deadline: float | None
    ) -> UpstreamResponse:
        """A GET or DELETE of `url` with `headers`, sent as post() sends (both are idempotent):
        a 2025-era session's GET stream, and its end."""
        origin = self.origin(url)
        data = b"%s%s%sContent-Length: 0\r\n\r\n" % (method, origin.target, headers)
        return await self._exchange(origin, data, deadline, True)

    async def _exchange(
        self, origin: Origin, data: bytes, deadline: float | None, idempotent: bool
    ) -> UpstreamResponse:
        conn = self._take(origin)
        if conn is None:
            return await (await self._connect(origin, deadline)).exchange(data, deadline)
        try:
            return await conn.exchange(data, deadline)
        except Broken as exc:
            if not idempotent or exc.answered:
                raise
        return await (await self._connect(origin, deadline)).exchange(data, deadline)

    async def close(self) -> None:
        """Close every connection, idle or not; in-flight exchanges fail with Broken."""
        self._closed = True
        for conn in list(self._owners):
            conn.close()
        self._idle.clear()

    def _take(self, origin: Origin) -> Connection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        now = self.now()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self._idle_timeout_s:
                return conn
            conn.close()
        return None

    async def _connect(self, origin: Origin, deadline: float | None) -> Connection:
        if self._closed:
            raise ConnectFailed("the gateway is shutting down")
        loop = asyncio.get_running_loop()
        tls = self._tls_context() if origin.tls else None
        # A slow connect must not eat the call's deadline, nor outlive it; either way the
        # request was never sent, so the caller may try another replica.
        within = self._connect_timeout_s
        if deadline is not None:
            within = min(within, deadline - loop.time())
        if within <= 0:
            raise DeadlineExceeded("the deadline passed before connecting")
        try:
            async with asyncio.timeout(within):
                _, conn = await loop.create_connection(
                    lambda: Connection(loop, self._release, origin.limits),
                    origin.host,
                    origin.port,
                    ssl=tls,
                    server_hostname=origin.host if tls else None,
                )
        except TimeoutError:
            raise ConnectFailed(f"no connection within {within:.3g} s") from None
        except OSError as exc:
            raise ConnectFailed(f"the connection failed ({type(exc).__name__})") from None
        self._owners[conn] = origin
        return conn

    def _release(self, conn: Connection) -> None:
        """A connection is free again, or gone (`closed`)."""
        origin = self._owners.get(conn)
        if origin is None:
            return
        idle = self._idle.setdefault(origin, deque())
        if conn.closed:
            del self._owners[conn]
            if conn in idle:
                idle.remove(conn)
            return
        if self._closed or len(idle) >= MAX_IDLE_PER_ORIGIN:
            conn.close()
            return
        conn.idle_since = self.now()
        idle.append(conn)

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls
