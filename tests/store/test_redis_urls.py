"""Store URLs: the four Redis forms parse into what redis-py's clients take; a wrong one is
refused with the URL (its password masked) and what is wrong; causes read as plain words."""

from __future__ import annotations

import ssl

import pytest
from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    MovedError,
    RedisClusterException,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.errors import CLIENT_MESSAGE, RedisUnavailable
from gateway.store.redis_errors import explain
from gateway.store.redis_url import (
    ClusterURL,
    SentinelURL,
    StandaloneURL,
    StoreURLError,
    masked,
    parse_redis_url,
)


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("redis://127.0.0.1:6379/0", StandaloneURL("redis://127.0.0.1:6379/0", tls=False)),
        (
            "rediss://:pw@redis.internal:6380/2",
            StandaloneURL("rediss://:pw@redis.internal:6380/2", tls=True),
        ),
        ("unix:///run/redis.sock?db=1", StandaloneURL("unix:///run/redis.sock?db=1", tls=False)),
        (
            "redis+sentinel://:p%40ss@10.0.0.1:26379,10.0.0.2:26380/taskgate",
            SentinelURL(
                (("10.0.0.1", 26379), ("10.0.0.2", 26380)), "taskgate", 0, None, "p@ss", tls=False
            ),
        ),
        (
            "rediss+sentinel://gate:pw@sentinel-a,sentinel-b/routes/3",
            SentinelURL(
                (("sentinel-a", 26379), ("sentinel-b", 26379)), "routes", 3, "gate", "pw", tls=True
            ),
        ),
        (
            "redis+cluster://10.0.0.1:7000,[::1]:7001,node-c",
            ClusterURL(
                (("10.0.0.1", 7000), ("::1", 7001), ("node-c", 6379)), None, None, tls=False
            ),
        ),
        (
            "rediss+cluster://:pw@10.0.0.1:7000/",
            ClusterURL((("10.0.0.1", 7000),), None, "pw", tls=True),
        ),
    ],
)
def test_each_form_parses_into_what_its_client_takes(url: str, parsed: object) -> None:
    assert parse_redis_url(url) == parsed


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("memcached://127.0.0.1:11211", "unsupported scheme 'memcached'"),
        ("redis://:pw@10.0.0.1:6379,10.0.0.2:6379/0", "names one server; for several use"),
        ("redis://:pw@127.0.0.1:99999/0", "the port is a number from 1 to 65535"),
        ("redis://:pw@127.0.0.1:6379/zero", "the path is a database number (/0), not /zero"),
        ("unix://", "a unix URL names a socket file"),
        ("rediss://h:6380/0?ssl_cert_reqs=none", "TLS is set in store.tls, not by the option"),
        ("redis+sentinel://:pw@10.0.0.1:26379", "no service name"),
        ("redis+sentinel://:pw@10.0.0.1:26379/taskgate/x", "a database number (/0), not /x"),
        ("redis+sentinel://:pw@/taskgate", "no sentinel: list them as host:port,host:port"),
        ("redis+sentinel://pw@10.0.0.1/taskgate", "write the password as :password@"),
        ("redis+sentinel://:@10.0.0.1/taskgate", "the password after ':' is empty"),
        ("redis+cluster://:pw@10.0.0.1:7000/0", "a cluster URL ends after its nodes"),
        ("redis+cluster://:pw@10.0.0.1:7000?ssl=true", "options (?...) and fragments"),
        ("redis+cluster://:pw@10.0.0.1:7000,10.0.0.1:7000", "a seed node is listed twice"),
        ("redis+cluster://:pw@10.0.0.1:port", "seed node '10.0.0.1:port': the port is a number"),
        ("redis+cluster://:pw@[::1", "write an IPv6 address as [::1]:port"),
        ("redis://:p/w@10.0.0.1:6379/0", "write a '/' in the password as %2F"),
        ("redis+cluster://:p/w@10.0.0.1:7000", "write a '/' in the password as %2F"),
    ],
)
def test_a_wrong_url_is_refused_naming_it_masked_and_what_is_wrong(url: str, said: str) -> None:
    with pytest.raises(StoreURLError) as refused:
        parse_redis_url(url)
    message = str(refused.value)
    assert message.startswith(f"{masked(url)}: "), message
    assert said in message
    assert ":pw@" not in message


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://gate:s3cret@host:6379/0", "redis://gate:***@host:6379/0"),
        ("redis://s3cret@host:6379/0", "redis://***@host:6379/0"),
        ("redis://:p@ss@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://:pa/ss@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://host:6379/0?password=s3cret&db=1", "redis://host:6379/0?password=***&db=1"),
        ("redis+sentinel://:s3cret@a:1,b:2/svc", "redis+sentinel://:***@a:1,b:2/svc"),
        ("redis+cluster://a:1,b:2", "redis+cluster://a:1,b:2"),
        ("sqlite:///./routes.db", "sqlite:///./routes.db"),
    ],
)
def test_a_url_is_shown_with_its_password_masked(url: str, shown: str) -> None:
    assert masked(url) == shown


def _raised_in(outer: Exception, inner: BaseException) -> Exception:
    """`outer` as redis-py raises it: while handling `inner`."""
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904  # the implicit chain is what redis-py leaves
    except Exception as caught:
        return caught


def _verification_failure() -> ssl.SSLCertVerificationError:
    failure = ssl.SSLCertVerificationError(1, "certificate verify failed")
    failure.verify_message = "unable to get local issuer certificate"
    return failure


@pytest.mark.parametrize(
    ("exc", "cause"),
    [
        (
            AuthenticationError("invalid username-password pair or user is disabled."),
            "the server refused the password (invalid username-password pair",
        ),
        (
            AuthenticationError("Authentication required."),
            "the server asks for a password and the URL gives none",
        ),
        (
            MasterNotFoundError("No master found for 'taskgate'"),
            "no sentinel named a master for the service (No master found for 'taskgate')",
        ),
        (
            ClusterDownError("The cluster is down"),
            "the cluster is down (CLUSTERDOWN The cluster is down)",
        ),
        (
            MovedError("3999 127.0.0.1:6381"),
            "the route's slot moved to 127.0.0.1:6381 (a failover or resharding)",
        ),
        (
            _raised_in(
                RedisConnectionError(
                    "Error 1 connecting to 127.0.0.1:6380. certificate verify failed"
                ),
                _verification_failure(),
            ),
            "TLS verification of the server's certificate failed (unable to get local issuer",
        ),
        (
            _raised_in(
                RedisClusterException("Redis Cluster cannot be connected."),  # type: ignore[no-untyped-call,unused-ignore]
                AuthenticationError("invalid username-password pair"),
            ),
            "the server refused the password",
        ),
        (RedisTimeoutError("Timeout reading from socket"), "no answer within 4 s"),
        (
            RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
            "cannot connect (Error 111 connecting to 127.0.0.1:6379. Connection refused.)",
        ),
    ],
    ids=[
        "wrong password",
        "no password",
        "no master",
        "cluster down",
        "slot moved",
        "TLS verification",
        "a cluster's wrong password",
        "timeout",
        "refused",
    ],
)
def test_each_cause_reads_in_plain_words(exc: Exception, cause: str) -> None:
    assert explain(exc, tls=True, timeout_s=4).startswith(cause)


def test_the_operator_reads_store_and_cause_and_a_client_neither() -> None:
    unavailable = RedisUnavailable("redis+cluster://:***@10.0.0.1:7000", "the cluster is down")
    assert str(unavailable) == (
        "the task store redis+cluster://:***@10.0.0.1:7000 is unavailable: the cluster is down; "
        "retry"
    )
    assert unavailable.message == CLIENT_MESSAGE
    assert b"10.0.0.1" not in unavailable.body()
