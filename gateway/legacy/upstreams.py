"""The 2025-era sessions taskgate opens on backends for a client's session: one per backend,
opened on the first request that needs it, recorded in the client's session (so that any
instance sends the next request to the same replica and session), and ended with it.

Also taskgate's other calls on those sessions: the client's answers to a backend's requests,
the notifications it sends (cancelled, roots/list_changed), and DELETE.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson

from gateway.auth import Principal
from gateway.bridge import own_session
from gateway.bridge.own_session import Opened, visible_ascii
from gateway.config import LegacyConfig
from gateway.errors import (
    BadGateway,
    GatewayError,
    SessionNotFound,
    UpstreamUnreachable,
)
from gateway.legacy.sessions import Sessions, client_declared
from gateway.protocol.codes import RequestId
from gateway.protocol.era import SESSION_HEADER, legacy_headers
from gateway.store.sessions import LegacySession, UpstreamSession
from gateway.upstream.calls import UpstreamCallError, answer_of
from gateway.upstream.pool import Pool
from gateway.upstream.relay import header_lines, read_whole
from gateway.upstream.replicas import Backend, Replica

log = logging.getLogger("taskgate.legacy")

_ids = itertools.count(1)
JSON = "application/json"
_ACCEPT = "application/json, text/event-stream"


class Upstreams:
    """Opens, finds and ends the upstream sessions of clients' sessions."""

    def __init__(self, pool: Pool, sessions: Sessions, config: LegacyConfig) -> None:
        self._pool = pool
        self._sessions = sessions
        self._config = config
        # (client session id, backend) -> the opening in flight on this instance: two requests
        # of one session needing one backend at once open one upstream session. An entry lives
        # only while its opening does, so the map is bounded by the requests in flight.
        self._opening: dict[tuple[str, str], asyncio.Future[UpstreamSession]] = {}
        # DELETEs sent without waiting for them, kept referenced until they end (each bounded
        # by upstream_timeout_s); close() lets them finish.
        self._background: set[asyncio.Task[None]] = set()
        # Told of each upstream session bound here (FrontDoor: the session's GET streams join).
        self.on_bound: Callable[[LegacySession, Backend], None] | None = None

    def reconfigure(self, config: LegacyConfig) -> None:
        self._config = config

    async def bound(
        self,
        session: LegacySession,
        backend: Backend,
        candidates: list[Replica],
        principal: Principal,
        request_id: RequestId,
    ) -> tuple[Replica, UpstreamSession]:
        """The replica and upstream session of `backend` for `session`, opened now on the first
        of `candidates` that answers when none is recorded yet. SessionNotFound when the
        recorded replica left the configuration: the client initializes again (the revision's
        own recovery from a lost session)."""
        recorded = session.upstreams.get(backend.name)
        if recorded is None:
            key = (session.session_id, backend.name)
            pending = self._opening.get(key)
            if pending is None:
                pending = asyncio.get_running_loop().create_future()
                self._opening[key] = pending
                try:
                    opened = await self._open(session, backend, candidates, principal, request_id)
                except asyncio.CancelledError:
                    pending.cancel()  # the waiters' requests fail; their clients may retry
                    raise
                except Exception as failed:
                    pending.set_exception(failed)
                    pending.exception()  # retrieved: the waiters (if any) raise it themselves
                    raise
                finally:
                    del self._opening[key]
                pending.set_result(opened)
                recorded = opened
            else:
                recorded = await asyncio.shield(pending)
        replica = backend.replica(recorded.replica)
        if replica is None:
            await self.end(session)
            raise SessionNotFound(request_id)
        return replica, recorded

    async def _open(
        self,
        session: LegacySession,
        backend: Backend,
        candidates: list[Replica],
        principal: Principal,
        request_id: RequestId,
    ) -> UpstreamSession:
        headers = own_headers(backend, principal)
        for index, replica in enumerate(candidates):
            try:
                opened = await self._initialize(replica, session, headers, request_id)
            except UpstreamUnreachable:
                if index == len(candidates) - 1:
                    raise
                continue
            break
        else:
            raise AssertionError("a backend always has at least one replica")
        # The first binding of a backend wins, wherever it was made: a request that acted on a
        # stale copy of the record (another instance bound the backend meanwhile) uses the
        # recorded upstream session and ends its own.
        winner = await self._sessions.store.bind_upstream(
            session.session_id, session.owner, backend.name, opened
        )
        if winner != opened:
            self._end_later(opened, headers, session.protocol_version)
        if winner is None:
            raise SessionNotFound(request_id)
        upstreams = {**session.upstreams, backend.name: winner}
        updated = replace(session, upstreams=upstreams)
        self._sessions.remember(updated)
        if self.on_bound is not None:
            self.on_bound(updated, backend)
        return winner

    async def _initialize(
        self,
        replica: Replica,
        session: LegacySession,
        headers: dict[str, str],
        request_id: RequestId,
    ) -> UpstreamSession:
        """initialize and notifications/initialized on `replica`, in the client's revision and
        with the client's capabilities (so that a backend asks it what it can answer)."""
        own_id, body = _initialize_request(session)
        where = f"backend {replica.backend!r} ({replica.label})"
        upstream_id, message, status = await self._post_initialize(
            replica, headers, body, own_id, where, request_id
        )
        result = message.get("result") if isinstance(message, dict) else None
        if status != 200 or not isinstance(result, dict):
            error = message.get("error") if isinstance(message, dict) else None
            said = error.get("message") if isinstance(error, dict) else f"HTTP {status}"
            raise BadGateway(
                f"Bad gateway: {where} refused a 2025-era session: {said}", request_id=request_id
            )
        opened = UpstreamSession(replica=replica.url, session_id=upstream_id)
        version = result.get("protocolVersion")
        if version != session.protocol_version:
            self._end_later(opened, headers, session.protocol_version)
            raise BadGateway(
                f"Bad gateway: {where} answered initialize with protocol version {version!r}; "
                f"the client speaks {session.protocol_version} and taskgate does not translate "
                "between 2025-era revisions",
                request_id=request_id,
            )
        if upstream_id and not visible_ascii(upstream_id):
            raise BadGateway(
                f"Bad gateway: {where} opened a session whose Mcp-Session-Id is not visible ASCII",
                request_id=request_id,
            )
        initialized = orjson.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await self.notify(opened, headers, session.protocol_version, initialized)
        if session.log_level:  # the client set one before this backend was first reached
            await self._set_level_on(opened, headers, session.protocol_version, session.log_level)
        log.debug("opened a 2025-era session on %s for a client session", where)
        return opened

    async def _post_initialize(
        self,
        replica: Replica,
        headers: dict[str, str],
        body: bytes,
        own_id: str,
        where: str,
        request_id: RequestId,
    ) -> tuple[str, Any, int]:
        """POST the initialize request: the Mcp-Session-Id the replica assigned (or ""), its
        answer and the HTTP status. The wire's failures are the relay's (read_whole), with the
        client's request id: UpstreamUnreachable (the next replica is tried), a timeout, or
        BadGateway."""
        sent = header_lines({**headers, "Content-Type": JSON, "Accept": _ACCEPT})
        try:
            whole = await read_whole(
                self._pool,
                replica,
                own_id,
                body,
                sent,
                self._config.upstream_timeout_s,
                max_bytes=_MAX_ANSWER,
            )
        except GatewayError as failed:
            failed.request_id = request_id
            raise
        message = answer_of(whole)
        if whole.body and message is None:
            raise BadGateway(
                f"Bad gateway: {where} did not open a 2025-era session (its answer is not JSON)",
                request_id=request_id,
            )
        return whole.header(_SESSION_KEY) or "", message, whole.status

    async def notify(
        self, upstream: UpstreamSession, headers: dict[str, str], version: str, body: bytes
    ) -> int | None:
        """POST a notification or an answer on an upstream session; its HTTP status, or None
        when the replica could not be reached. Best effort: the caller decides what a failure
        means."""
        replica = _replica_at(upstream)
        status = await own_session.notify(
            self._pool,
            replica,
            _opened(upstream, version),
            headers,
            body,
            self._config.upstream_timeout_s,
        )
        if status is None:
            log.info("a 2025-era message to %s was not delivered", replica.label)
        return status

    async def set_level(
        self,
        session: LegacySession,
        backends: dict[str, Backend],
        principal: Principal,
        level: str,
    ) -> None:
        """The client's logging/setLevel on every upstream session of `session` (best effort:
        a backend that serves no logging refuses it, and sends no log messages either)."""
        sets = [
            self._set_level_on(
                upstream, own_headers(backends[name], principal), session.protocol_version, level
            )
            for name, upstream in session.upstreams.items()
            if name in backends
        ]
        await asyncio.gather(*sets)

    async def _set_level_on(
        self, upstream: UpstreamSession, headers: dict[str, str], version: str, level: str
    ) -> None:
        replica, opened, params = (
            _replica_at(upstream),
            _opened(upstream, version),
            {"level": level},
        )
        try:
            timeout_s = self._config.upstream_timeout_s
            await own_session.ask(
                self._pool, replica, opened, headers, "logging/setLevel", params, timeout_s
            )
        except UpstreamCallError as refused:
            log.debug("logging/setLevel on a 2025-era session at %s: %s", replica.label, refused)

    async def fan_out(
        self,
        session: LegacySession,
        backends: dict[str, Backend],
        principal: Principal,
        body: bytes,
    ) -> None:
        """A client notification to every upstream session of `session` (its request ids are
        unique in its session, so a backend that never saw the id ignores it)."""
        sends = [
            self.notify(
                upstream,
                own_headers(backends[name], principal),
                session.protocol_version,
                body,
            )
            for name, upstream in session.upstreams.items()
            if name in backends
        ]
        await asyncio.gather(*sends)

    async def end(
        self,
        session: LegacySession,
        backends: dict[str, Backend] | None = None,
        *,
        lost: bool = False,
    ) -> None:
        """End `session` in the store and every upstream session it recorded (DELETE, each at
        once, best effort: a backend that misses it expires the session itself). `lost`: it
        ends because an upstream session it relied on is gone, not at the client's asking."""
        ended = await self._sessions.end(session)
        if ended is None:
            return
        self._sessions.events["lost" if lost else "ended"] += 1
        await self._delete_all(ended, backends)

    def end_upstreams_later(self, ended: LegacySession, backends: dict[str, Backend]) -> None:
        """End the upstream sessions of a session the store already ended (evicted), without
        holding up the request that caused it."""
        if ended.upstreams:
            task = asyncio.get_running_loop().create_task(self._delete_all(ended, backends))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _delete_all(self, ended: LegacySession, backends: dict[str, Backend] | None) -> None:
        await asyncio.gather(
            *(
                self._delete(upstream, _headers_for(backends, name), ended.protocol_version)
                for name, upstream in ended.upstreams.items()
            )
        )

    def _end_later(self, upstream: UpstreamSession, headers: dict[str, str], version: str) -> None:
        """End an upstream session nobody will use, without holding up the request."""
        task = asyncio.get_running_loop().create_task(self._delete(upstream, headers, version))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _delete(
        self, upstream: UpstreamSession, headers: dict[str, str], version: str
    ) -> None:
        replica = _replica_at(upstream)
        failed = await own_session.end(
            self._pool,
            replica,
            _opened(upstream, version),
            headers,
            self._config.upstream_timeout_s,
        )
        if failed is not None:
            log.info("ending a 2025-era session on %s failed: %s", replica.label, failed)

    async def close(self) -> None:
        """Let the DELETEs under way finish (each is bounded by upstream_timeout_s)."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


_CLIENT_INFO = {"name": "taskgate", "version": "0"}


def _initialize_request(session: LegacySession) -> tuple[str, bytes]:
    """taskgate's own initialize for `session`: its id, and its body in the client's revision
    with the client's capabilities (less `tasks`) and clientInfo."""
    declared = client_declared(session)
    capabilities = declared.get("capabilities")
    capabilities = dict(capabilities) if isinstance(capabilities, dict) else {}
    capabilities.pop("tasks", None)  # legacy tasks are not served through taskgate
    client_info = declared.get("clientInfo")
    params = {
        "protocolVersion": session.protocol_version,
        "capabilities": capabilities,
        "clientInfo": client_info if isinstance(client_info, dict) else _CLIENT_INFO,
    }
    own_id = f"taskgate-initialize-{next(_ids)}"
    body = orjson.dumps({"jsonrpc": "2.0", "id": own_id, "method": "initialize", "params": params})
    return own_id, body


def own_headers(backend: Backend, principal: Principal) -> dict[str, str]:
    """taskgate's credential for `backend` and the verified identity, on every upstream call."""
    return {**backend.credentials, **backend.identity(principal.tenant, principal.subject)}


def _headers_for(backends: dict[str, Backend] | None, name: str) -> dict[str, str]:
    backend = None if backends is None else backends.get(name)
    return {} if backend is None else dict(backend.credentials)


def session_headers(upstream: UpstreamSession, version: str) -> dict[str, str]:
    """The headers of a request on an upstream session (gateway/protocol/era.py)."""
    return legacy_headers(upstream.session_id, version)


def _opened(upstream: UpstreamSession, version: str) -> Opened:
    """An upstream session as gateway/bridge/own_session.py sends on one."""
    return Opened(upstream.session_id, version, {})


def _replica_at(upstream: UpstreamSession) -> Replica:
    """The replica an upstream session is on, for the calls made on it: its URL is what the
    client's session records (the backend's name is the caller's, the label is the URL's)."""
    return Replica("", upstream.replica)


_SESSION_KEY = SESSION_HEADER.lower().encode("ascii")
_MAX_ANSWER = 1024 * 1024  # an initialize result is small; more is not a backend's answer
