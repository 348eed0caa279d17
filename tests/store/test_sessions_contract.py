"""One session contract, every store: 2025-era sessions in SQLite and in each Redis topology are
found only by their owner, carry their upstream sessions, expire, and are counted exactly per
owner, whose least recently used ones make room at its limit."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from gateway.store import sqlite_db
from gateway.store.base import now_ms
from gateway.store.keys import LEGACY_ALL_KEY, legacy_owner_key, legacy_session_key
from gateway.store.redis_routes import RedisRouteStore
from gateway.store.sessions import (
    LegacySession,
    Opening,
    OpenOutcome,
    SessionStore,
    UpstreamSession,
    owner_key,
)
from gateway.store.sqlite_routes import SQLiteRouteStore
from tests.support.mcp import poll_until

ALICE = owner_key("acme", "alice")
BOB = owner_key("acme", "bob")
REPORTS = UpstreamSession("http://127.0.0.1:9101/mcp", "upstream-reports-1")
SEARCH = UpstreamSession("http://127.0.0.1:9201/mcp", "upstream-search-1")
ROOMY = {"max_per_owner": 100, "max_total": 1000}
OPENED = Opening(OpenOutcome.OPENED)


def legacy(
    session_id: str = "session-1", *, principal: str = "alice", idle_ms: int = 60_000
) -> LegacySession:
    created = now_ms()
    return LegacySession(
        session_id=session_id,
        owner=owner_key("acme", principal),
        tenant="acme",
        principal=principal,
        protocol_version="2025-06-18",
        client=b'{"capabilities":{"roots":{}},"clientInfo":{"name":"t\xc3\xa9st","version":"1"}}',
        created_at_ms=created,
        expires_at_ms=created + idle_ms,
    )


async def gone(store: SessionStore, session_id: str, owner: str, *, within_s: float = 5) -> bool:
    """Whether the session stops being found before the deadline (its expiry is the store's)."""
    try:
        await poll_until(
            lambda: store.session(session_id, owner), lambda found: found is None, within=within_s
        )
    except TimeoutError:
        return False
    return True


async def test_an_opened_session_is_found_as_written(sessions: SessionStore) -> None:
    written = legacy()
    assert await sessions.open_session(written, **ROOMY) == OPENED
    found = await sessions.session("session-1", ALICE)
    assert found == written
    assert found is not None
    assert found.client == written.client
    assert dict(found.upstreams) == {}


async def test_another_owner_finds_nothing_and_changes_nothing(sessions: SessionStore) -> None:
    written = legacy()
    await sessions.open_session(written, **ROOMY)
    assert await sessions.session("session-1", BOB) is None
    assert await sessions.bind_upstream("session-1", BOB, "reports", REPORTS) is None
    assert await sessions.touch_session("session-1", BOB, now_ms() + 1) is False
    assert await sessions.end_session("session-1", BOB) is None
    assert await sessions.session("session-1", ALICE) == written


async def test_an_unknown_id_is_not_found(sessions: SessionStore) -> None:
    assert await sessions.session("never-opened", ALICE) is None
    assert await sessions.touch_session("never-opened", ALICE, now_ms() + 60_000) is False
    assert await sessions.end_session("never-opened", ALICE) is None


async def test_upstreams_bound_at_once_are_all_kept(sessions: SessionStore) -> None:
    await sessions.open_session(legacy(), **ROOMY)
    bound = await asyncio.gather(
        sessions.bind_upstream("session-1", ALICE, "reports", REPORTS),
        sessions.bind_upstream("session-1", ALICE, "search", SEARCH),
    )
    assert list(bound) == [REPORTS, SEARCH]
    found = await sessions.session("session-1", ALICE)
    assert found is not None
    assert dict(found.upstreams) == {"reports": REPORTS, "search": SEARCH}


async def test_the_first_bind_returns_its_own_upstream(sessions: SessionStore) -> None:
    await sessions.open_session(legacy(), **ROOMY)
    assert await sessions.bind_upstream("session-1", ALICE, "reports", REPORTS) == REPORTS
    found = await sessions.session("session-1", ALICE)
    assert found is not None
    assert dict(found.upstreams) == {"reports": REPORTS}


async def test_binding_again_keeps_and_returns_the_first_upstream(sessions: SessionStore) -> None:
    await sessions.open_session(legacy(), **ROOMY)
    await sessions.bind_upstream("session-1", ALICE, "reports", REPORTS)
    again = UpstreamSession("http://127.0.0.1:9102/mcp", "upstream-reports-2")
    assert await sessions.bind_upstream("session-1", ALICE, "reports", again) == REPORTS
    found = await sessions.session("session-1", ALICE)
    assert found is not None
    assert dict(found.upstreams) == {"reports": REPORTS}


async def test_concurrent_binds_of_one_backend_agree_on_one(sessions: SessionStore) -> None:
    await sessions.open_session(legacy(), **ROOMY)
    other = UpstreamSession("http://127.0.0.1:9102/mcp", "upstream-reports-2")
    first, second = await asyncio.gather(
        sessions.bind_upstream("session-1", ALICE, "reports", REPORTS),
        sessions.bind_upstream("session-1", ALICE, "reports", other),
    )
    assert first == second
    assert first in (REPORTS, other)
    found = await sessions.session("session-1", ALICE)
    assert found is not None
    assert dict(found.upstreams) == {"reports": first}


async def test_binding_to_an_ended_or_unknown_session_fails(sessions: SessionStore) -> None:
    await sessions.open_session(legacy(), **ROOMY)
    await sessions.end_session("session-1", ALICE)
    assert await sessions.bind_upstream("session-1", ALICE, "reports", REPORTS) is None
    assert await sessions.bind_upstream("never-opened", ALICE, "reports", REPORTS) is None
    assert await sessions.session("session-1", ALICE) is None


async def test_touch_moves_the_expiry(sessions: SessionStore) -> None:
    written = legacy()
    await sessions.open_session(written, **ROOMY)
    later = written.expires_at_ms + 3_600_000
    assert await sessions.touch_session("session-1", ALICE, later) is True
    assert await sessions.session("session-1", ALICE) == replace(written, expires_at_ms=later)


async def test_a_session_touched_to_a_short_expiry_is_gone_after_it(sessions: SessionStore) -> None:
    await sessions.open_session(legacy(), **ROOMY)
    await sessions.bind_upstream("session-1", ALICE, "reports", REPORTS)
    assert await sessions.touch_session("session-1", ALICE, now_ms() + 300) is True
    assert await gone(sessions, "session-1", ALICE)
    assert await sessions.touch_session("session-1", ALICE, now_ms() + 60_000) is False
    assert await sessions.bind_upstream("session-1", ALICE, "search", SEARCH) is None
    assert await sessions.end_session("session-1", ALICE) is None


async def test_a_session_already_expired_is_never_found(sessions: SessionStore) -> None:
    await sessions.open_session(replace(legacy(), expires_at_ms=now_ms() - 1), **ROOMY)
    assert await sessions.session("session-1", ALICE) is None


async def test_a_logging_level_is_kept_with_the_session(sessions: SessionStore) -> None:
    written = legacy()
    await sessions.open_session(written, **ROOMY)
    upstream = UpstreamSession("http://127.0.0.1:9101/mcp", "abc")
    await sessions.bind_upstream("session-1", ALICE, "reports", upstream)
    assert await sessions.set_log_level("session-1", ALICE, "warning")
    assert await sessions.set_log_level("session-1", ALICE, "error")  # the last one wins
    found = await sessions.session("session-1", ALICE)
    assert found is not None
    assert (found.log_level, dict(found.upstreams)) == ("error", {"reports": upstream})
    # Another owner's, or an unknown session: nothing set.
    assert not await sessions.set_log_level("session-1", owner_key("acme", "bob"), "debug")
    assert not await sessions.set_log_level("no-such-session", ALICE, "debug")
    again = await sessions.session("session-1", ALICE)
    assert again is not None
    assert again.log_level == "error"


async def test_end_returns_the_session_with_its_upstreams_once(sessions: SessionStore) -> None:
    written = legacy()
    await sessions.open_session(written, **ROOMY)
    await sessions.bind_upstream("session-1", ALICE, "reports", REPORTS)
    ended = await sessions.end_session("session-1", ALICE)
    assert ended == replace(written, upstreams={"reports": REPORTS})
    assert await sessions.session("session-1", ALICE) is None
    assert await sessions.end_session("session-1", ALICE) is None


async def test_opening_an_id_again_replaces_it_and_counts_it_once(sessions: SessionStore) -> None:
    await sessions.open_session(legacy(), max_per_owner=1, max_total=1)
    await sessions.bind_upstream("session-1", ALICE, "reports", REPORTS)
    again = legacy()
    assert (
        await sessions.open_session(again, max_per_owner=1, max_total=1) == OPENED
    )  # none evicted
    assert await sessions.session("session-1", ALICE) == again


async def test_at_its_limit_an_owner_ends_its_least_recently_used_session(
    sessions: SessionStore,
) -> None:
    limits = {"max_per_owner": 3, "max_total": 1000}
    a, b, c = legacy("a"), legacy("b"), legacy("c")
    for opened in (a, b, c):
        assert await sessions.open_session(opened, **limits) == OPENED
    await sessions.bind_upstream("c", ALICE, "reports", REPORTS)
    # Used after c was opened: c is the least recently used though it is the newest.
    assert await sessions.touch_session("b", ALICE, c.expires_at_ms + 2_000)
    assert await sessions.touch_session("a", ALICE, c.expires_at_ms + 1_000)

    d = legacy("d")
    evicted = replace(c, upstreams={"reports": REPORTS})
    assert await sessions.open_session(d, **limits) == Opening(OpenOutcome.OPENED, (evicted,))
    assert await sessions.session("c", ALICE) is None
    assert await sessions.end_session("c", ALICE) is None
    assert [await sessions.session(x, ALICE) is not None for x in ("a", "b", "d")] == [True] * 3

    # Another owner counts and evicts only its own.
    bobs = [legacy(f"bob{n}", principal="bob") for n in range(4)]
    for opened in bobs[:3]:
        assert await sessions.open_session(opened, **limits) == OPENED
    assert await sessions.open_session(bobs[3], **limits) == Opening(OpenOutcome.OPENED, (bobs[0],))
    assert [await sessions.session(x, ALICE) is not None for x in ("a", "b", "d")] == [True] * 3

    # An expired session is not counted: nothing is evicted in its place.
    assert await sessions.touch_session("d", ALICE, now_ms() + 300)
    assert await gone(sessions, "d", ALICE)
    assert await sessions.open_session(legacy("e"), **limits) == OPENED
    assert [await sessions.session(x, ALICE) is not None for x in ("a", "b", "e")] == [True] * 3


async def test_a_lowered_owner_limit_evicts_down_to_it(sessions: SessionStore) -> None:
    base = now_ms() + 60_000
    held = [replace(legacy(f"a{n}"), expires_at_ms=base + n * 1_000) for n in range(4)]
    for opened in held:
        assert await sessions.open_session(opened, **ROOMY) == OPENED
    newest = legacy("a4")
    opening = await sessions.open_session(newest, max_per_owner=2, max_total=1000)
    assert opening == Opening(OpenOutcome.OPENED, tuple(held[:3]))  # least recently used first
    found = [await sessions.session(s.session_id, ALICE) for s in [*held, newest]]
    assert found == [None, None, None, held[3], newest]


async def test_the_total_limit_counts_every_owner(sessions: SessionStore) -> None:
    limits = {"max_per_owner": 10, "max_total": 2}
    assert await sessions.open_session(legacy("a0"), **limits) == OPENED
    assert await sessions.open_session(legacy("b0", principal="bob"), **limits) == OPENED
    carol = legacy("c0", principal="carol")
    assert await sessions.open_session(carol, **limits) == Opening(OpenOutcome.STORE_FULL)
    assert await sessions.session("c0", carol.owner) is None

    await sessions.end_session("a0", ALICE)
    assert await sessions.open_session(carol, **limits) == OPENED


async def test_concurrent_opens_of_one_owner_keep_exactly_its_limit(
    sessions: SessionStore,
) -> None:
    records = [legacy(f"a{n}") for n in range(20)]
    openings = await asyncio.gather(
        *(sessions.open_session(s, max_per_owner=5, max_total=1000) for s in records)
    )
    assert {opening.outcome for opening in openings} == {OpenOutcome.OPENED}
    evicted = [ended.session_id for opening in openings for ended in opening.evicted]
    assert len(evicted) == 15
    found = await asyncio.gather(*(sessions.session(s.session_id, ALICE) for s in records))
    live = {s.session_id for s, f in zip(records, found, strict=True) if f is not None}
    assert len(live) == 5
    assert set(evicted) == {s.session_id for s in records} - live  # each evicted once


def test_owner_key_is_stable_and_tells_callers_apart() -> None:
    assert owner_key("acme", "alice") == owner_key("acme", "alice")
    assert len(owner_key("acme", "alice")) == 24
    assert owner_key("acme", "alice") != owner_key("acme", "bob")
    assert owner_key("acme", "alice") != owner_key("umbrella", "alice")
    assert owner_key("a\x00b", "c") != owner_key("a", "b\x00c")
    assert owner_key("ab", "c") != owner_key("a", "bc")
    assert owner_key("", "ac") != owner_key("a", "c")


def test_an_owners_sessions_and_their_count_share_one_cluster_slot() -> None:
    owner = owner_key("acme", "alice")
    slot = key_slot(legacy_owner_key(owner).encode())
    assert key_slot(legacy_session_key(owner, "any-id").encode()) == slot
    assert key_slot(legacy_session_key(owner, "{other}").encode()) == slot


async def test_sqlite_purges_expired_sessions_with_their_upstreams(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_db, "PURGE_EVERY_S", 0.0)
    path = tmp_path / "routes.db"
    routes = SQLiteRouteStore(path, timeout_s=2)
    await routes.open()
    store = routes.sessions()
    try:
        await store.open_session(legacy("old"), **ROOMY)
        await store.bind_upstream("old", ALICE, "reports", REPORTS)
        await store.touch_session("old", ALICE, now_ms() - 1)
        await store.open_session(legacy("new"), **ROOMY)  # purges, at most every PURGE_EVERY_S
        with contextlib.closing(sqlite3.connect(path)) as raw:
            sessions = raw.execute("SELECT session_id FROM legacy_sessions").fetchall()
            upstreams = raw.execute("SELECT count(*) FROM legacy_upstreams").fetchone()
        assert sessions == [("new",)]
        assert upstreams == (0,)
    finally:
        await routes.close()


async def test_redis_keeps_a_session_as_one_expiring_hash_counted_in_two_sets(
    redis_url: str,
) -> None:
    routes = RedisRouteStore(redis_url, timeout_s=2)
    store = routes.sessions()
    raw = aioredis.Redis.from_url(redis_url)
    try:
        written = legacy()
        await store.open_session(written, **ROOMY)
        await store.bind_upstream("session-1", ALICE, "reports", REPORTS)
        key = legacy_session_key(ALICE, "session-1")
        assert set(await raw.hkeys(key)) == {b"r", b"e", b"u:reports"}
        assert await raw.pexpiretime(key) == written.expires_at_ms
        assert await raw.zscore(legacy_owner_key(ALICE), "session-1") == written.expires_at_ms
        assert await raw.zscore(LEGACY_ALL_KEY, "session-1") == written.expires_at_ms

        later = written.expires_at_ms + 60_000
        await store.touch_session("session-1", ALICE, later)
        assert await raw.pexpiretime(key) == later
        assert await raw.zscore(legacy_owner_key(ALICE), "session-1") == later
        assert await raw.zscore(LEGACY_ALL_KEY, "session-1") == later

        await store.end_session("session-1", ALICE)
        assert await raw.exists(key, legacy_owner_key(ALICE), LEGACY_ALL_KEY) == 0
    finally:
        await raw.aclose()
        await routes.close()


async def test_redis_eviction_leaves_no_trace_of_the_evicted_session(redis_url: str) -> None:
    routes = RedisRouteStore(redis_url, timeout_s=2)
    store = routes.sessions()
    raw = aioredis.Redis.from_url(redis_url)
    try:
        await store.open_session(legacy("old"), **ROOMY)
        await store.bind_upstream("old", ALICE, "reports", REPORTS)
        opening = await store.open_session(legacy("new"), max_per_owner=1, max_total=1000)
        assert [ended.session_id for ended in opening.evicted] == ["old"]
        assert await raw.exists(legacy_session_key(ALICE, "old")) == 0
        assert await raw.zrange(legacy_owner_key(ALICE), 0, -1) == [b"new"]
        assert await raw.zrange(LEGACY_ALL_KEY, 0, -1) == [b"new"]
    finally:
        await raw.aclose()
        await routes.close()
