"""Resource subscriptions relayed from backends that push: taskgate's own upstream listens.

A downstream listen's `resourceSubscriptions` are routed as resources/read routes a URI (a
route naming it whose backend lists it, else a visible route with a template that could
produce it): unknown, unrouted and hidden URIs are left out alike. The rest are grouped by
backend, and each replica of each such backend gets one `subscriptions/listen` of taskgate's
own (its own id, the headers and `_meta` of taskgate's calls, the backend's credentials and
the caller's identity headers) naming that backend's URIs. The SDK's MCPServer keeps events on
the replica where they happen (an in-memory bus), hence a listen on every replica; the
Listener coalesces per URI, so a change seen twice costs at most one more event.

The downstream acknowledgement waits for the upstream ones, at most
`subscriptions.ack_timeout_s`: a URI is honoured when a replica of its backend acknowledged it.
A backend that answers with an error (FastMCP 4.1.4: HTTP 404, -32601) or stays silent honours
nothing, and its listens are closed. After that, each upstream `notifications/resources/updated`
for an honoured URI of that backend reaches the Listener with the client's subscriptionId;
every other message, comment and the listen's own result is dropped. A listen that ends or
fails is opened again with backoff, and a new acknowledgement is followed by one
resources/updated per URI it covers: the protocol replays nothing, so the client is told to
read again. Everything ends with the downstream stream.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

import aiohttp
import orjson

from gateway.auth import Principal
from gateway.discovery import Catalog
from gateway.listen.stream import ACKNOWLEDGED, Listener
from gateway.protocol.meta import CLIENT_CAPABILITIES_KEY, PROTOCOL_VERSION_KEY, SUPPORTED_VERSIONS
from gateway.protocol.sse import FrameTooLarge, SSEDecoder
from gateway.routing.replicas import Backend, Replica

log = logging.getLogger("taskgate.listen")

LISTEN = "subscriptions/listen"
UPDATED = "notifications/resources/updated"
RESOURCES = "resourceSubscriptions"
_MAX_FRAME_BYTES = 1024 * 1024  # an ack names at most max_resource_uris URIs; an event one
_MAX_REFUSAL_BYTES = 64 * 1024  # of a refusal's body, read for the log
_FIRST_BACKOFF_S = 0.5
_MAX_BACKOFF_S = 30.0


class UpstreamListens:
    """Every upstream listen of this process, over a connection pool of their own: a stream
    holds its connection for as long as it lasts, and must not take one discovery needs."""

    def __init__(
        self,
        backends: dict[str, Backend],
        catalog: Catalog,
        *,
        ack_timeout_s: float,
    ) -> None:
        self._backends = backends
        self._catalog = catalog
        self.ack_timeout_s = ack_timeout_s
        self._session: aiohttp.ClientSession | None = None  # made on first use, in the loop
        self._ids = itertools.count(1)
        self._sets: set[ResourceListen] = set()
        self.streams = 0  # upstream listen answers open now (acknowledged or not yet)

    @property
    def listens(self) -> int:
        """Downstream listens with upstream listens of their own, open now."""
        return len(self._sets)

    async def subscribe(
        self, listener: Listener, uris: tuple[str, ...], principal: Principal
    ) -> ResourceListen:
        """Route `uris` for `principal` and open the upstream listens, without waiting for
        their acknowledgements (ResourceListen.acknowledged does)."""
        by_backend: dict[str, list[str]] = {}
        for uri in uris:
            route = await self._catalog.resource_route(uri, principal.tenant)
            if route is not None:
                by_backend.setdefault(route.backend, []).append(uri)
        resources = ResourceListen(self, listener, uris)
        for name, wanted in by_backend.items():
            backend = self._backends[name]
            headers = {
                **backend.credentials,
                **backend.identity(principal.tenant, principal.subject),
            }
            for replica in backend.replicas:
                resources.add(_Leg(self, resources, replica, tuple(wanted), headers))
        self._sets.add(resources)
        resources.start()
        return resources

    async def close(self) -> None:
        for resources in list(self._sets):
            await resources.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=None),  # a listen lasts; see _Leg.attempt
            )
        return self._session

    def next_id(self) -> str:
        return f"taskgate-listen-{next(self._ids)}"

    def forget(self, resources: ResourceListen) -> None:
        self._sets.discard(resources)


class ResourceListen:
    """The upstream listens of one downstream listen, and what they relay to its Listener."""

    __slots__ = (
        "_early",
        "_honoured",
        "_legs",
        "_owner",
        "_uris",
        "decided",
        "listener",
    )

    def __init__(self, owner: UpstreamListens, listener: Listener, uris: tuple[str, ...]) -> None:
        self._owner = owner
        self.listener = listener
        self._uris = uris  # as the client asked, in its order
        self._legs: list[_Leg] = []
        self._honoured: frozenset[str] = frozenset()
        self._early: dict[str, dict[str, Any]] = {}  # updates seen before the decision
        self.decided = asyncio.Event()  # set once the downstream acknowledgement is decided

    def add(self, leg: _Leg) -> None:
        self._legs.append(leg)

    def start(self) -> None:
        for leg in self._legs:
            leg.task = asyncio.create_task(leg.run())

    async def acknowledged(self) -> list[str]:
        """The URIs to acknowledge downstream, in the client's order: those a replica of their
        backend acknowledged within ack_timeout_s. The listens of a backend that honours
        nothing are closed; the others relay from now on."""
        legs = self._legs
        if legs:
            try:
                async with asyncio.timeout(self._owner.ack_timeout_s):
                    await asyncio.gather(*(leg.resolved.wait() for leg in legs))
            except TimeoutError:
                pass  # a silent replica honours nothing
        honoured: set[str] = set()
        for leg in legs:
            honoured.update(leg.acked)
        self._honoured = frozenset(honoured)
        # A backend that honours nothing has nothing to relay, ever: its listens are closed
        # (and their answers released) before the acknowledgement goes out.
        idle = [leg.task for leg in legs if leg.task is not None and not self.honoured(leg)]
        for task in idle:
            task.cancel()
        await asyncio.gather(*idle, return_exceptions=True)
        self.decided.set()
        early, self._early = self._early, {}
        for uri, params in early.items():
            if uri in self._honoured:
                self._push(params)
        return [uri for uri in self._uris if uri in self._honoured]

    def honoured(self, leg: _Leg) -> frozenset[str]:
        """What `leg` relays: its URIs the downstream acknowledgement names."""
        return self._honoured.intersection(leg.uris)

    def updated(self, leg: _Leg, params: dict[str, Any]) -> None:
        """An upstream resources/updated (params less the upstream's `_meta`)."""
        uri = params.get("uri")
        if not isinstance(uri, str) or uri not in leg.uris:
            return  # not one this backend was asked about
        if not self.decided.is_set():
            if uri in leg.acked:
                self._early.pop(uri, None)
                self._early[uri] = params
            return
        if uri in self._honoured:
            self._push(params)

    def _push(self, params: dict[str, Any]) -> None:
        listener = self.listener
        listener.push(("resource", params["uri"]), listener.notification(UPDATED, params))

    async def close(self) -> None:
        """End every upstream listen of this downstream listen and release its answers (kept
        by the owner until they are: its close() finishes what a cancelled close left)."""
        tasks = [leg.task for leg in self._legs if leg.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._owner.forget(self)


class _Leg:
    """One upstream listen, to one replica, for the URIs its backend serves."""

    __slots__ = ("_headers", "_owner", "_set", "acked", "replica", "resolved", "task", "uris")

    def __init__(
        self,
        owner: UpstreamListens,
        resources: ResourceListen,
        replica: Replica,
        uris: tuple[str, ...],
        headers: dict[str, str],
    ) -> None:
        self._owner = owner
        self._set = resources
        self.replica = replica
        self.uris = uris
        self._headers = headers
        self.acked: frozenset[str] = frozenset()  # what its first acknowledgement named
        self.resolved = asyncio.Event()  # its first listen was acknowledged, or failed
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        await self.attempt(fresh=False)
        self.resolved.set()
        await self._set.decided.wait()
        failures = 0
        while self._set.honoured(self):
            failures += 1
            delay = min(_MAX_BACKOFF_S, _FIRST_BACKOFF_S * 2 ** (failures - 1))
            log.info("%s at %s: listening again in %.1f s", LISTEN, self.replica.label, delay)
            await asyncio.sleep(delay)  # the backoff's cadence, not a synchronisation
            started = time.monotonic()
            if await self.attempt(fresh=True) and time.monotonic() - started >= _MAX_BACKOFF_S:
                failures = 0  # it held a while: the next drop starts the backoff over

    async def attempt(self, *, fresh: bool) -> bool:
        """One upstream listen, until it ends; whether it was acknowledged. A fresh one (not
        the first) is followed by one resources/updated per URI it covers."""
        owner = self._owner
        replica = self.replica
        request_id = owner.next_id()
        version = SUPPORTED_VERSIONS[0]
        body = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": LISTEN,
            "params": {
                "notifications": {RESOURCES: list(self.uris)},
                "_meta": {PROTOCOL_VERSION_KEY: version, CLIENT_CAPABILITIES_KEY: {}},
            },
        }
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": version,
            "Mcp-Method": LISTEN,
            **self._headers,
        }
        acked = False
        opened = False
        try:
            async with (
                asyncio.timeout(owner.ack_timeout_s) as deadline,
                owner.session().post(
                    replica.url, data=orjson.dumps(body), headers=headers, allow_redirects=False
                ) as response,
            ):
                owner.streams += 1
                opened = True
                content_type = response.headers.get("Content-Type", "").partition(";")[0]
                if response.status != 200 or content_type.strip() != "text/event-stream":
                    refusal = await response.content.read(_MAX_REFUSAL_BYTES)
                    log.debug(
                        "%s at %s refused (HTTP %d): %r",
                        LISTEN,
                        replica.label,
                        response.status,
                        refusal[:200],
                    )
                    return False
                decoder = SSEDecoder(_MAX_FRAME_BYTES)
                while True:
                    chunk = await response.content.readany()
                    if not chunk:
                        return acked  # the upstream ended its stream
                    for frame in decoder.feed(chunk):
                        message = _message(frame.data)
                        if message is None:
                            continue  # a comment (`: ping`) or not a JSON-RPC message
                        if "method" not in message:
                            if message.get("id") == request_id:
                                return acked  # the listen's result, or an error before the ack
                            continue
                        method = message["method"]
                        params = message.get("params")
                        if not isinstance(params, dict):
                            continue
                        if method == ACKNOWLEDGED and not acked:
                            acked = True
                            deadline.reschedule(None)  # acknowledged: the stream may last
                            self._acknowledged(params, fresh=fresh)
                        elif method == UPDATED and acked:
                            self._set.updated(
                                self, {k: v for k, v in params.items() if k != "_meta"}
                            )
        except (TimeoutError, OSError, aiohttp.ClientError, FrameTooLarge) as exc:
            log.debug("%s at %s: %s", LISTEN, replica.label, type(exc).__name__)
            return acked
        except Exception:
            log.exception("%s at %s failed", LISTEN, replica.label)
            return acked
        finally:
            if opened:
                owner.streams -= 1

    def _acknowledged(self, params: dict[str, Any], *, fresh: bool) -> None:
        notifications = params.get("notifications")
        named = notifications.get(RESOURCES) if isinstance(notifications, dict) else None
        acked = (
            frozenset(uri for uri in named if isinstance(uri, str))
            if isinstance(named, list)
            else frozenset()
        )
        if not fresh:
            self.acked = acked.intersection(self.uris)
            self.resolved.set()
            return
        # Nothing is replayed: whatever changed while this listen was down is told as a change.
        for uri in self.uris:
            if uri in acked:
                self._set.updated(self, {"uri": uri})


def _message(data: str | None) -> dict[str, Any] | None:
    """The JSON-RPC message an SSE event carries, or None."""
    if data is None:
        return None
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return message if isinstance(message, dict) else None
