"""One backend's view read anew from its replicas (the catalogue decides when: discovery.py).

Discovery reads server/discover and every page of tools/list from one replica; a failure of
either makes that replica's answer unusable and the next replica is asked. The other lists are
optional: each is kept (every page read) only when discover advertises its capability
(`capabilities.prompts`, `capabilities.resources`); it is asked alongside discover when the last
discover advertised it, after it otherwise. A list that fails, whole or on any page,
is logged and keeps the items last seen for it (none on the first look): the backend keeps its
tools and its other lists, and a flaky list neither hides the backend nor empties for a refresh.

A replica of the 2025 era (configured, or learned when its discover is refused:
gateway/bridge/era.py) is read the same way over taskgate's own session on it, its
discover made from its initialize result (gateway/bridge/shapes.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.bridge.era import may_be_2025
from gateway.bridge.eras import Eras
from gateway.bridge.shapes import discover_of
from gateway.catalog.capabilities import advertises
from gateway.catalog.views import LIST_KINDS, BackendView, ListKind
from gateway.upstream.calls import UpstreamCallError, call
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend, Replica

log = logging.getLogger("taskgate.discovery")

MAX_LIST_PAGES = 100  # a backend that pages forever must not hold a refresh forever
DISCOVERY_TIMEOUT_S = 5.0

# One request of discovery on one replica: a method and its params, to its result object.
Ask = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


async def fetch_view(
    pool: Pool,
    eras: Eras,
    backend: Backend,
    previous: BackendView | None,
    first: Replica | None = None,
) -> BackendView:
    """Ask the replicas in turn (`first` first, when given) until one answers discover and
    tools/list; read the optional lists it advertises from that replica, keeping `previous`
    items of a list that fails."""
    failure: UpstreamCallError | None = None
    for attempt, _ in enumerate(backend.replicas):
        replica = first if attempt == 0 and first is not None else backend.pick()
        try:
            return await _fetch_in_its_era(pool, eras, backend, replica, previous)
        except UpstreamCallError as exc:
            failure = exc
    assert failure is not None  # a backend has at least one replica
    raise failure


async def _fetch_in_its_era(
    pool: Pool, eras: Eras, backend: Backend, replica: Replica, previous: BackendView | None
) -> BackendView:
    """`replica`'s view in the era it speaks; when not known yet, in 2026-07-28 first, then in
    the 2025 era when its refusal may be a 2025-era server's and it accepts initialize."""
    if eras.speaks_2025(backend, replica):
        return await _fetch_2025(eras, backend, replica, previous)
    try:
        view = await _fetch_from(pool, backend, replica, previous)
    except UpstreamCallError as refused:
        if refused.status is None:
            eras.forget(replica)
        if backend.era != "auto" or not may_be_2025(refused):
            raise
        try:
            await eras.session(backend, replica)
        except UpstreamCallError as also:
            raise UpstreamCallError(f"{refused}; and initialize: {also}") from None
        log.info(
            "backend %r (%s) speaks the 2025 era (%s): taskgate speaks it there",
            backend.name,
            replica.label,
            eras.era_of(replica),
        )
        return await _fetch_2025(eras, backend, replica, previous)
    eras.learned_modern(replica)
    return view


async def _fetch_from(
    pool: Pool,
    backend: Backend,
    replica: Replica,
    previous: BackendView | None,
) -> BackendView:
    """One 2026-07-28 replica's view. discover, tools/list and the optional lists `previous`
    advertised are asked at once: one round trip rather than three, which a refresh pushed by a
    list_changed is timed on (a kept-alive backend connection can stall ~40 ms a round on
    delayed ACKs). A list the new discover advertises and the old did not is read after;
    one it no longer advertises is dropped."""

    async def ask(method: str, params: dict[str, Any]) -> dict[str, Any]:
        return await call(
            pool,
            replica,
            method,
            params,
            timeout_s=DISCOVERY_TIMEOUT_S,
            headers=backend.credentials,
        )

    guessed = [k for k in LIST_KINDS if previous and advertises(previous.discover, k.capability)]
    asked_discover = asyncio.ensure_future(ask("server/discover", {}))
    asked_tools = asyncio.ensure_future(_read_list(ask, backend, "tools/list", "tools", "name"))
    asked = {
        k.name: asyncio.ensure_future(_optional_list(ask, backend, k, previous)) for k in guessed
    }
    every = [asked_discover, asked_tools, *asked.values()]
    try:
        await asyncio.gather(*every)
    except BaseException:  # discover or tools failed (or we were cancelled): end the rest
        for task in every:
            task.cancel()
        await asyncio.gather(*every, return_exceptions=True)
        raise
    lists = {name: task.result() for name, task in asked.items()}
    return await _view(ask, backend, asked_discover.result(), asked_tools.result(), lists, previous)


async def _fetch_2025(
    eras: Eras, backend: Backend, replica: Replica, previous: BackendView | None
) -> BackendView:
    """One 2025-era replica's view, over taskgate's own session on it: its discover made
    from its initialize result, then its lists, one request at a time on the session."""

    async def ask(method: str, params: dict[str, Any]) -> dict[str, Any]:
        return await eras.ask(backend, replica, method, params)

    opened = await eras.session(backend, replica)
    tools = await _read_list(ask, backend, "tools/list", "tools", "name")
    return await _view(ask, backend, discover_of(opened.result), tools, {}, previous)


async def _view(
    ask: Ask,
    backend: Backend,
    discover: dict[str, Any],
    tools: dict[str, dict[str, Any]],
    lists: dict[str, dict[str, dict[str, Any]]],
    previous: BackendView | None,
) -> BackendView:
    """The view: `lists` already read, and the lists `discover` advertises that are not."""
    late = [k for k in LIST_KINDS if advertises(discover, k.capability) and k.name not in lists]
    found = await asyncio.gather(*(_optional_list(ask, backend, k, previous) for k in late))
    lists = {**lists, **dict(zip((k.name for k in late), found, strict=True))}
    kept = {k.name: lists[k.name] if advertises(discover, k.capability) else {} for k in LIST_KINDS}
    return BackendView(
        discover=discover,
        tools=tools,
        fetched_at=time.monotonic(),
        prompts=kept["prompts"],
        resources=kept["resources"],
        templates=kept["templates"],
    )


async def _optional_list(
    ask: Ask, backend: Backend, kind: ListKind, previous: BackendView | None
) -> dict[str, dict[str, Any]]:
    try:
        return await _read_list(ask, backend, kind.method, kind.field, kind.key)
    except UpstreamCallError as exc:
        kept: dict[str, dict[str, Any]] = getattr(previous, kind.name) if previous else {}
        log.warning(
            "backend %r: %s failed, keeping the %d items last seen: %s",
            backend.name,
            kind.method,
            len(kept),
            exc,
        )
        return kept


async def _read_list(
    ask: Ask, backend: Backend, method: str, field: str, key: str
) -> dict[str, dict[str, Any]]:
    """Every item of every page of `method`, by its `key`, the first of duplicates kept."""
    items: dict[str, dict[str, Any]] = {}
    cursor: str | None = None
    for _page in range(MAX_LIST_PAGES):
        result = await ask(method, {"cursor": cursor} if cursor is not None else {})
        found = result.get(field)
        for item in found if isinstance(found, list) else ():
            if isinstance(item, dict) and isinstance(item.get(key), str):
                items.setdefault(item[key], item)
        # An absent nextCursor ends the list; "" is a cursor like any other.
        cursor = result.get("nextCursor")
        if not isinstance(cursor, str):
            return items
    log.warning(
        "backend %r: %s has more than %d pages; the rest is left out",
        backend.name,
        method,
        MAX_LIST_PAGES,
    )
    return items
