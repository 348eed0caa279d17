"""A TLS store's connections share one TLS context per set of files (a burst of new connections
does not read the trust store once each), read a rotated file at the next new connection, and
trust the configured CA alone."""

from __future__ import annotations

import asyncio
import os
import ssl
from dataclasses import replace

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import SSLConnection

from gateway.store import redis_tls
from gateway.store.redis_routes import RedisRouteStore
from tests.store.conftest import StoreTarget
from tests.store.test_contract import route
from tests.support.redis_topologies import Certificates


@pytest.mark.parametrize("fixture", ["tls_target", "tls_sentinel_target"])
async def test_a_burst_of_new_tls_connections_shares_one_context(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    target: StoreTarget = request.getfixturevalue(fixture)
    store = RedisRouteStore(target.url, tls=target.tls, timeout_s=2)
    try:
        # Twenty at once on a store that has no connection yet: twenty connections open.
        routes = [replace(route(f"burst-{n}"), tenant=f"t{n}") for n in range(20)]
        await asyncio.gather(*(store.record(r) for r in routes))
        client = store.link.client
        assert isinstance(client, Redis)
        pool = client.connection_pool
        opened = [*pool._available_connections, *pool._in_use_connections]
        assert len(opened) > 1
        assert all(isinstance(c, SSLConnection) for c in opened)
        contexts = {id(c.ssl_context.get()) for c in opened if isinstance(c, SSLConnection)}
        assert len(contexts) == 1
        assert [await store.lookup(r.task_id) for r in routes] == routes
    finally:
        await store.close()


def options(certs: Certificates) -> redis_tls.SharedSSLContext:
    """What redis-py makes for a connection of a store configured with `certs`."""
    return redis_tls.SharedSSLContext(
        keyfile=str(certs.client_key),
        certfile=str(certs.client_cert),
        cert_reqs="required",
        ca_certs=str(certs.ca),
        check_hostname=True,
    )


def test_a_rotated_file_is_read_at_the_next_new_connection(tls_certificates: Certificates) -> None:
    first = options(tls_certificates).get()
    assert options(tls_certificates).get() is first
    # The operator puts a new certificate in place (here: the same bytes, written anew).
    cert = tls_certificates.client_cert
    written = cert.stat()
    os.utime(cert, ns=(written.st_atime_ns, written.st_mtime_ns + 1_000_000_000))
    try:
        rotated = options(tls_certificates).get()
        assert rotated is not first
        assert options(tls_certificates).get() is rotated
    finally:
        os.utime(cert, ns=(written.st_atime_ns, written.st_mtime_ns))


def test_the_configured_ca_alone_is_trusted(tls_certificates: Certificates) -> None:
    context = options(tls_certificates).get()
    assert context.cert_store_stats()["x509_ca"] == 1
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    # Without a CA file, the system's trusted CAs, as redis-py would.
    system = redis_tls.SharedSSLContext(cert_reqs="required").get()
    assert (
        system.cert_store_stats()["x509_ca"]
        == ssl.create_default_context().cert_store_stats()["x509_ca"]
    )


def test_the_process_holds_a_bounded_number_of_contexts(tls_certificates: Certificates) -> None:
    for n in range(redis_tls.MAX_CONTEXTS + 3):  # as many sets of options, each made once
        redis_tls.SharedSSLContext(ca_certs=str(tls_certificates.ca), password=str(n)).get()
    assert len(redis_tls._made) == redis_tls.MAX_CONTEXTS
