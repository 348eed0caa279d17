"""One backend's view read anew from its replicas (the catalogue decides when: discovery.py).

Discovery reads server/discover and every page of tools/list from one replica; a failure of
either makes that replica's answer unusable and the next replica is asked. The other lists are
optional: each is kept (every page read) only when discover advertises its capability
(`capabilities.prompts`, `capabilities.resources`); it is asked alongside discover when the last
discover advertised it, after it otherwise. A list that fails, whole or on any page,
is logged and keeps the items last seen for it (none on the first look): the backend keeps its
tools and its other lists, and a flaky list neither hides the backend nor empties for a refresh.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from gateway.catalog.capabilities import advertises
from gateway.catalog.views import LIST_KINDS, BackendView, ListKind
from gateway.upstream.calls import UpstreamCallError, call
from gateway.upstream.pool import Pool
from gateway.upstream.replicas import Backend, Replica

log = logging.getLogger("taskgate.discovery")

MAX_LIST_PAGES = 100  # a backend that pages forever must not hold a refresh forever
DISCOVERY_TIMEOUT_S = 5.0


async def fetch_view(
    pool: Pool,
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
            return await _fetch_from(pool, backend, replica, previous)
        except UpstreamCallError as exc:
            failure = exc
    assert failure is not None  # a backend has at least one replica
    raise failure


async def _fetch_from(
    pool: Pool,
    backend: Backend,
    replica: Replica,
    previous: BackendView | None,
) -> BackendView:
    """One replica's view. discover, tools/list and the optional lists `previous` advertised
    are asked at once: one round trip rather than three, which a refresh pushed by a
    list_changed is timed on (a kept-alive backend connection can stall ~40 ms a round on
    delayed ACKs). A list the new discover advertises and the old did not is read after;
    one it no longer advertises is dropped."""
    guessed = [k for k in LIST_KINDS if previous and advertises(previous.discover, k.capability)]
    asked_discover = asyncio.ensure_future(
        call(
            pool,
            replica,
            "server/discover",
            timeout_s=DISCOVERY_TIMEOUT_S,
            headers=backend.credentials,
        )
    )
    asked_tools = asyncio.ensure_future(
        _read_list(pool, backend, replica, "tools/list", "tools", "name")
    )
    asked = {
        k.name: asyncio.ensure_future(_optional_list(pool, backend, replica, k, previous))
        for k in guessed
    }
    every = [asked_discover, asked_tools, *asked.values()]
    try:
        await asyncio.gather(*every)
    except BaseException:  # discover or tools failed (or we were cancelled): end the rest
        for task in every:
            task.cancel()
        await asyncio.gather(*every, return_exceptions=True)
        raise
    discover = asked_discover.result()
    lists = {name: task.result() for name, task in asked.items()}
    late = [k for k in LIST_KINDS if advertises(discover, k.capability) and k.name not in lists]
    found = await asyncio.gather(
        *(_optional_list(pool, backend, replica, k, previous) for k in late)
    )
    lists.update(zip((k.name for k in late), found, strict=True))
    kept = {k.name: lists[k.name] if advertises(discover, k.capability) else {} for k in LIST_KINDS}
    return BackendView(
        discover=discover,
        tools=asked_tools.result(),
        fetched_at=time.monotonic(),
        prompts=kept["prompts"],
        resources=kept["resources"],
        templates=kept["templates"],
    )


async def _optional_list(
    pool: Pool,
    backend: Backend,
    replica: Replica,
    kind: ListKind,
    previous: BackendView | None,
) -> dict[str, dict[str, Any]]:
    try:
        return await _read_list(pool, backend, replica, kind.method, kind.field, kind.key)
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
    pool: Pool,
    backend: Backend,
    replica: Replica,
    method: str,
    field: str,
    key: str,
) -> dict[str, dict[str, Any]]:
    """Every item of every page of `method`, by its `key`, the first of duplicates kept."""
    items: dict[str, dict[str, Any]] = {}
    cursor: str | None = None
    for _page in range(MAX_LIST_PAGES):
        params = {"cursor": cursor} if cursor is not None else {}
        result = await call(
            pool,
            replica,
            method,
            params,
            timeout_s=DISCOVERY_TIMEOUT_S,
            headers=backend.credentials,
        )
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
