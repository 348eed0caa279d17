"""The GET stream of a 2025-era session: what the client is owed outside its requests.

It merges two sources. list_changed comes from taskgate's own comparison of what the tenant
sees (gateway/listen/lists.py), as for a modern listen, since taskgate's lists are not any one
backend's; a backend's own list_changed is not relayed (the comparison sees it). Everything else
a backend sends on its upstream session's GET stream (resources/updated, log messages, its
requests to the client under namespaced ids) is relayed as it comes. The session's record is
read again every keepalive, so that upstream sessions opened since (on any instance) join, and
the stream ends when the session does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from functools import partial
from typing import Any

import orjson

from gateway.auth import Principal
from gateway.config import LegacyConfig
from gateway.errors import Retryable, UnsafeHeader
from gateway.h1.request import DownstreamRequest, Stream
from gateway.legacy import wire
from gateway.legacy.sessions import Sessions
from gateway.legacy.upstreams import own_headers, session_headers
from gateway.limits.limiter import Limiter
from gateway.limits.streams import StreamCounts
from gateway.listen.filter import LIST_FLAGS
from gateway.listen.lists import ListWatcher
from gateway.listen.stream import KEEPALIVE, ListenStream, PendingBudget
from gateway.protocol.sse import FrameTooLarge, SSEDecoder, encode_event
from gateway.store.sessions import LegacySession, UpstreamSession
from gateway.upstream.framing import ConnectFailed, ExchangeError
from gateway.upstream.pool import Pool
from gateway.upstream.relay import (
    EVENT_STREAM,
    SSE_HEADERS,
    content_type,
    header_lines,
    relay_stream,
)
from gateway.upstream.replicas import Backend

log = logging.getLogger("taskgate.legacy")

_ALL_LISTS = frozenset(LIST_FLAGS)
_LIST_CHANGED = frozenset(LIST_FLAGS.values())
# One event of a backend's GET stream (notifications and requests to the client are small); a
# larger one ends that backend's relay, so a stream owes at most max_pending_events of these.
MAX_EVENT_BYTES = 64 * 1024


class LegacyListener(ListenStream):
    """A ListenStream whose notifications are 2025-era ones: no subscription id in `_meta`, and no
    listen result at the end (the stream just ends)."""

    __slots__ = ("_events",)

    def __init__(self, session_id: str, tenant: str, principal: str, budget: PendingBudget) -> None:
        super().__init__(session_id, tenant, principal, budget)
        self._events = itertools.count()

    def notification(self, method: str, params: dict[str, Any] | None = None) -> bytes:
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params:
            body["params"] = params
        return encode_event(orjson.dumps(body).decode(), event="message")

    def relay(self, data: bytes) -> None:
        """An upstream message, owed as it is (never coalesced with another)."""
        self.push(("upstream", str(next(self._events))), encode_event(data.decode()))

    def _result(self) -> bytes:
        return b""


class Streams:
    """The GET streams of this process, bounded by legacy.max_streams, and those of one
    tenant and one principal by limits.*.session_streams (as listen streams are)."""

    def __init__(self, config: LegacyConfig, pool: Pool, limits: Limiter) -> None:
        self._config = config
        self._pool = pool
        self._listeners: set[LegacyListener] = set()
        self._open = StreamCounts("session_streams", limits)  # per tenant and principal
        # what the streams owe their clients, together
        self.pending = PendingBudget(config.max_pending_bytes, "legacy.max_pending_bytes")
        self._draining = False
        # Each open stream's relays by session id: an upstream session bound here joins its
        # session's streams at once (joined), not at the next look of _keep.
        self._joins: dict[str, list[_Joining]] = {}
        self.resuming = 0  # resumed streams being relayed (legacy.max_streams counts them)

    @property
    def open(self) -> int:
        return len(self._listeners) + self.resuming

    def reconfigure(self, config: LegacyConfig) -> None:
        self._config = config
        self.pending.limit = config.max_pending_bytes

    def drain(self) -> None:
        """End every stream gracefully; new ones end as they start."""
        self._draining = True
        for listener in self._listeners:
            listener.end()

    async def close(self) -> None:
        self.drain()

    async def resume(
        self,
        request: DownstreamRequest,
        session: LegacySession,
        principal: Principal,
        backends: dict[str, Backend],
        last_event_id: str,
    ) -> Stream | None:
        """A GET with Last-Event-ID: the event id is a backend's (relayed as it sent it), so
        each upstream session of `session` is asked to resume after it, and the first that
        answers with an event stream is relayed as this GET's answer (a call's answer the
        backend moved to polling comes this way), until it ends. None when none does: the
        client gets the session's GET stream instead, without a replay."""
        if self.open >= self._config.max_streams:
            raise Retryable("taskgate holds as many 2025-era GET streams as it may; retry")
        if "\r" in last_event_id or "\n" in last_event_id or len(last_event_id) > 1024:
            return None
        for name, upstream in session.upstreams.items():
            backend = backends.get(name)
            if backend is None:
                continue
            headers = {
                **own_headers(backend, principal),
                **session_headers(upstream, session.protocol_version),
                "Accept": "text/event-stream",
                "Last-Event-ID": last_event_id,
            }
            try:
                response = await self._pool.bodiless(
                    b"GET", upstream.replica, header_lines(headers), deadline=None
                )
            except (ConnectFailed, ExchangeError, UnsafeHeader) as failed:
                log.info("resuming a stream at %s failed: %s", upstream.replica, failed)
                continue
            if response.status != 200 or content_type(response) != EVENT_STREAM:
                response.close()  # another backend's event id, or none it kept
                continue
            replica = backend.replica(upstream.replica)
            if replica is None:  # its replica left the configuration
                response.close()
                continue
            rewrite = partial(wire.rewrite_request, backend=name)  # its requests namespaced
            self.resuming += 1
            try:
                return await relay_stream(response, self._pool, replica, request, rewrite)
            finally:
                self.resuming -= 1
        return None

    def joined(self, session: LegacySession, backend: Backend) -> None:
        """`session` has an upstream session of `backend` this process just bound: its streams
        here relay it now (a backend may send what it owes the client only while a GET stream
        is open, as the TypeScript SDK does, and drop it otherwise)."""
        only = {backend.name: backend}
        for joining in self._joins.get(session.session_id, ()):
            self._relay_new(joining.listener, session, joining.principal, only, joining.relays)

    async def serve(
        self,
        request: DownstreamRequest,
        session: LegacySession,
        principal: Principal,
        sessions: Sessions,
        backends: dict[str, Backend],
        lists: ListWatcher,
        keepalive_s: float,
    ) -> Stream:
        """The stream, until the client leaves, the session ends, or taskgate drains."""
        if len(self._listeners) >= self._config.max_streams:
            raise Retryable("taskgate holds as many 2025-era GET streams as it may; retry")
        self._open.check(principal, None)
        listener = LegacyListener(
            session.session_id, principal.tenant, principal.subject, self.pending
        )
        # Its place is taken before the first await, so that concurrent GETs cannot all pass.
        self._listeners.add(listener)
        self._open.take(principal.tenant, principal.subject)
        relays: dict[str, asyncio.Task[None]] = {}
        keeper: asyncio.Task[None] | None = None
        joining = _Joining(listener, principal, relays)
        self._joins.setdefault(session.session_id, []).append(joining)
        try:
            await lists.watch(listener, _ALL_LISTS)  # retryable when no backend answers
            stream = request.stream(200, dict(SSE_HEADERS))
            self._relay_new(listener, session, principal, backends, relays)
            keeper = asyncio.get_running_loop().create_task(
                self._keep(listener, session, principal, sessions, backends, relays, keepalive_s)
            )
            if self._draining:
                listener.end()
            await listener.run(stream, KEEPALIVE, keepalive_s, request.cut)
            return stream
        finally:
            joins = self._joins[session.session_id]
            joins.remove(joining)
            if not joins:
                del self._joins[session.session_id]
            listener.close()  # what it still owes is let go
            lists.forget(listener)
            self._listeners.discard(listener)
            self._open.give_back(principal.tenant, principal.subject)
            tasks = [*relays.values(), *([keeper] if keeper is not None else [])]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _keep(
        self,
        listener: LegacyListener,
        session: LegacySession,
        principal: Principal,
        sessions: Sessions,
        backends: dict[str, Backend],
        relays: dict[str, asyncio.Task[None]],
        period_s: float,
    ) -> None:
        """Every `period_s`: end the stream when its session is gone; relay the upstream
        sessions opened since, and again those whose relay ended (a backend that restarted
        its stream)."""
        while True:
            await asyncio.sleep(period_s)  # the cadence of the look, not a synchronisation
            try:
                current = await sessions.store.session(session.session_id, session.owner)
            except Retryable as exc:
                log.info("a 2025-era GET stream could not read its session: %s", exc.message)
                continue
            if current is None:
                listener.end()
                return
            self._relay_new(listener, current, principal, backends, relays)

    def _relay_new(
        self,
        listener: LegacyListener,
        session: LegacySession,
        principal: Principal,
        backends: dict[str, Backend],
        relays: dict[str, asyncio.Task[None]],
    ) -> None:
        for name, upstream in session.upstreams.items():
            backend = backends.get(name)
            running = relays.get(name)
            if backend is None or (running is not None and not running.done()):
                continue
            headers = {
                **own_headers(backend, principal),
                **session_headers(upstream, session.protocol_version),
            }
            relays[name] = asyncio.get_running_loop().create_task(
                self._relay(listener, name, upstream, headers)
            )

    async def _relay(
        self,
        listener: LegacyListener,
        backend: str,
        upstream: UpstreamSession,
        headers: dict[str, str],
    ) -> None:
        """One upstream session's GET stream into the client's, until either ends."""
        limit = self._config.max_pending_events
        sent = header_lines({**headers, "Accept": "text/event-stream"})
        try:
            # No deadline: the stream lasts as long as the session's client listens.
            response = await self._pool.bodiless(b"GET", upstream.replica, sent, deadline=None)
        except (ConnectFailed, ExchangeError, UnsafeHeader) as failed:
            log.info("the GET stream of %s did not open: %s", upstream.replica, failed)
            return
        try:
            if response.status != 200:
                # 405: the backend offers no GET stream; 404: its session is gone (the
                # client's next request says so). Either way nothing to relay.
                return
            decoder = SSEDecoder(max_frame_bytes=MAX_EVENT_BYTES)
            async for chunk in response.chunks():
                for frame in decoder.feed(chunk):
                    if frame.data is None:
                        continue
                    data = frame.data.encode()
                    if _is_list_changed(data):
                        continue
                    listener.relay(wire.rewrite_request(data, backend))
                    if listener.owed > limit:
                        log.warning("a 2025-era GET stream owes its client %d events; ended", limit)
                        listener.end()
                        return
        except (ExchangeError, ValueError, FrameTooLarge) as exc:
            log.info("the GET stream of %s ended: %s", upstream.replica, type(exc).__name__)
        finally:
            response.close()


class _Joining:
    """What an open stream needs to relay an upstream session bound after it opened."""

    __slots__ = ("listener", "principal", "relays")

    def __init__(
        self,
        listener: LegacyListener,
        principal: Principal,
        relays: dict[str, asyncio.Task[None]],
    ) -> None:
        self.listener = listener
        self.principal = principal
        self.relays = relays


def _is_list_changed(data: bytes) -> bool:
    if b"list_changed" not in data:
        return False
    with contextlib.suppress(orjson.JSONDecodeError):
        message = orjson.loads(data)
        return isinstance(message, dict) and message.get("method") in _LIST_CHANGED
    return False
