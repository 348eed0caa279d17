"""One contract, every store: SQLite on disk and real Redis servers (one, on TLS, behind Sentinel,
a cluster; Sentinel and cluster on TLS too) behave the same way."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace
from pathlib import Path

from gateway.store.base import Recorded, TaskRoute, TaskRouteStore, now_ms
from gateway.store.sessions import LegacySession, owner_key
from gateway.store.sqlite_routes import SQLiteRouteStore


def route(task_id: str = "task-1", *, tenant: str = "acme", ttl_s: float = 60) -> TaskRoute:
    created = now_ms()
    return TaskRoute(
        task_id=task_id,
        backend="reports",
        replica="http://127.0.0.1:9101/mcp",
        tenant=tenant,
        principal="alice",
        created_at_ms=created,
        ttl_ms=int(ttl_s * 1000),
        expires_at_ms=created + int(ttl_s * 1000),
    )


async def test_a_recorded_route_is_found_as_written(store: TaskRouteStore) -> None:
    written = route()
    assert await store.record(written) is Recorded.INSERTED
    assert await store.lookup("task-1") == written


async def test_an_unknown_id_is_not_found(store: TaskRouteStore) -> None:
    assert await store.lookup("never-recorded") is None


async def test_an_unlimited_ttl_is_kept_as_none(store: TaskRouteStore) -> None:
    written = replace(route(), ttl_ms=None)
    await store.record(written)
    found = await store.lookup("task-1")
    assert found is not None
    assert found.ttl_ms is None


async def test_ownership_is_insert_only(store: TaskRouteStore) -> None:
    first = route()
    await store.record(first)
    thief = replace(first, tenant="evil", replica="http://127.0.0.1:6666/mcp")
    assert await store.record(thief) is Recorded.CONFLICT
    assert await store.lookup("task-1") == first


async def test_recording_the_same_owner_again_is_harmless(store: TaskRouteStore) -> None:
    first = route()
    await store.record(first)
    assert await store.record(first) is Recorded.ALREADY
    assert await store.lookup("task-1") == first


async def test_an_expired_route_is_gone_and_its_id_may_be_recorded_again(
    store: TaskRouteStore,
) -> None:
    expired = replace(route(), expires_at_ms=now_ms() - 1)
    await store.record(expired)
    assert await store.lookup("task-1") is None
    fresh = route()
    assert await store.record(fresh) is Recorded.INSERTED
    assert await store.lookup("task-1") == fresh


async def test_refresh_moves_only_the_expiry(store: TaskRouteStore) -> None:
    first = route()
    await store.record(first)
    later = first.expires_at_ms + 3_600_000
    await store.refresh_expiry("task-1", 7_200_000, later)
    assert await store.lookup("task-1") == replace(first, ttl_ms=7_200_000, expires_at_ms=later)


async def test_refresh_to_the_past_expires_the_route(store: TaskRouteStore) -> None:
    await store.record(route())
    await store.refresh_expiry("task-1", 0, now_ms() - 1)
    assert await store.lookup("task-1") is None


async def test_refresh_never_revives_or_creates_a_route(store: TaskRouteStore) -> None:
    await store.refresh_expiry("nobody", 1000, now_ms() + 60_000)
    assert await store.lookup("nobody") is None


async def test_concurrent_records_of_one_id_have_exactly_one_winner(store: TaskRouteStore) -> None:
    contenders = [replace(route(), tenant=f"tenant-{i}") for i in range(20)]
    outcomes = await asyncio.gather(*(store.record(c) for c in contenders))
    assert outcomes.count(Recorded.INSERTED) == 1
    assert outcomes.count(Recorded.CONFLICT) == 19
    winner = contenders[outcomes.index(Recorded.INSERTED)]
    assert await store.lookup("task-1") == winner


async def test_sqlite_routes_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "routes.db"
    first = SQLiteRouteStore(path, timeout_s=2)
    await first.open()
    await first.record(route())
    await first.close()
    second = SQLiteRouteStore(path, timeout_s=2)
    await second.open()
    try:
        found = await second.lookup("task-1")
        assert found is not None
        assert found.tenant == "acme"
    finally:
        await second.close()


async def test_a_2025_era_tasks_session_is_kept_with_its_route(store: TaskRouteStore) -> None:
    written = replace(route(), session="2025-11-25 3f2a-session")
    await store.record(written)
    assert await store.lookup("task-1") == written
    assert await store.lookup_owned("task-1", "acme", "alice") == written


async def test_an_sqlite_file_from_before_sessions_is_migrated(tmp_path: Path) -> None:
    """A database made before task routes had a session and 2025-era sessions a logging
    level: its routes stay, with none, and both columns are there."""
    path = tmp_path / "routes.db"
    old = sqlite3.connect(path)
    old.executescript(
        """
        CREATE TABLE task_routes (
            task_id TEXT PRIMARY KEY, backend TEXT NOT NULL, replica TEXT NOT NULL,
            tenant TEXT NOT NULL, principal TEXT NOT NULL, created_at_ms INTEGER NOT NULL,
            ttl_ms INTEGER, expires_at_ms INTEGER NOT NULL
        ) WITHOUT ROWID;
        CREATE TABLE legacy_sessions (
            owner TEXT NOT NULL, session_id TEXT NOT NULL, record BLOB NOT NULL,
            expires_at_ms INTEGER NOT NULL, PRIMARY KEY (owner, session_id)
        ) WITHOUT ROWID;
        """
    )
    kept = route()
    old.execute(
        "INSERT INTO task_routes VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (kept.task_id, kept.backend, kept.replica, kept.tenant, kept.principal,
         kept.created_at_ms, kept.ttl_ms, kept.expires_at_ms),
    )  # fmt: skip
    old.commit()
    old.close()
    store = SQLiteRouteStore(path, timeout_s=2)
    await store.open()
    try:
        assert await store.lookup("task-1") == kept
        bridged = replace(route("task-2"), session="2025-11-25 abc")
        assert await store.record(bridged) is Recorded.INSERTED
        assert await store.lookup("task-2") == bridged
        # Its 2025-era sessions' table got the logging level too.
        client = LegacySession(
            "s-1", owner_key("acme", "alice"), "acme", "alice", "2025-11-25", b"{}", 0,
            now_ms() + 60_000,
        )  # fmt: skip
        sessions = store.sessions()
        await sessions.open_session(client, max_per_owner=10, max_total=100)
        assert await sessions.set_log_level("s-1", client.owner, "info")
        found = await sessions.session("s-1", client.owner)
        assert found is not None
        assert found.log_level == "info"
    finally:
        await store.close()
