"""Redis failures in plain words, naming the store: what an operator reads in logs and /readyz."""

from __future__ import annotations

import ssl

from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import (
    AskError,
    AuthenticationError,
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    MaxConnectionsError,
    MovedError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# What a server with its AOF off answers WAITAOF (Redis 7.2+, Valkey): "WAITAOF cannot be used
# when numlocal is set but appendonly is disabled."; and the same in an operator's words.
_AOF_DISABLED = "appendonly is disabled"
AOF_OFF = "WAITAOF needs appendonly yes on the server"

# Errors that mean the cluster's layout is changing (or failed), not that the server refused
# what was asked: the client backs off from them as from a lost connection.
TOPOLOGY_ERRORS = (ClusterDownError, AskError, TryAgainError)


def pool_exhausted(exc: BaseException) -> bool:
    """Whether redis-py refused for want of a free pooled connection (its pool at
    max_connections): a limit of this process, not a failure of the store."""
    return any(isinstance(link, MaxConnectionsError) for link in _chain(exc))


def aof_off(exc: BaseException) -> bool:
    """Whether the server refused WAITAOF because its AOF is off (`appendonly no`): no retry
    helps until an operator turns it on again."""
    return isinstance(exc, ResponseError) and _AOF_DISABLED in str(exc)


def explain(exc: BaseException, *, tls: bool, timeout_s: float) -> str:
    """What went wrong, in words an operator can act on, from the most telling error in the
    chain redis-py raised (a TLS or password failure is wrapped in a ConnectionError, a
    cluster's in a RedisClusterException)."""
    chain = _chain(exc)
    said = _tls_or_password(chain)
    if said is None:
        said = _topology(chain[0])
    if said is None:
        said = _server(chain[0], chain, tls=tls, timeout_s=timeout_s)
    return said


def _tls_or_password(chain: list[BaseException]) -> str | None:
    """A TLS or password failure anywhere in the chain, which says most; None if none."""
    for link in chain:
        if isinstance(link, ssl.SSLCertVerificationError):
            return (
                f"TLS verification of the server's certificate failed ({link.verify_message}): "
                "is store.tls.ca_file the CA that signed it, and is the host in it?"
            )
    for link in chain:
        if isinstance(link, ssl.SSLError):
            reason = link.reason or str(link)
            if "CERTIFICATE_REQUIRED" in reason:
                return (
                    f"the server asks for a client certificate ({reason}): give "
                    "store.tls.cert_file and key_file"
                )
            return f"the TLS handshake failed ({reason})"
        if isinstance(link, AuthenticationError):
            return _authentication(str(link))
    return None


def _topology(top: BaseException) -> str | None:
    """A Sentinel's or a cluster's failure; None for any other."""
    if isinstance(top, MasterNotFoundError):
        return (
            f"no sentinel named a master for the service ({top}): a service name the "
            "sentinels do not watch, a master they see as down, or no sentinel reachable"
        )
    if isinstance(top, MovedError):
        return (
            f"the route's slot moved to {top.host}:{top.port} (a failover or resharding); "
            "the next call follows it"
        )
    if isinstance(top, AskError):
        return f"the route's slot is being migrated to {top.host}:{top.port} (resharding)"
    if isinstance(top, MasterDownError):
        return f"the replica answering lost its master (MASTERDOWN {top})"
    if isinstance(top, ClusterDownError):
        return (
            f"the cluster is down (CLUSTERDOWN {top}): a master failed and no replica has "
            "taken over yet, or some slots have no node"
        )
    if isinstance(top, TryAgainError):
        return f"the cluster is moving the route's slot (TRYAGAIN {top})"
    if isinstance(top, SlotNotCoveredError):
        return f"no node of the cluster serves the route's slot ({top})"
    if isinstance(top, RedisClusterException):
        return f"the cluster could not be reached ({top})"
    return None


def _server(top: BaseException, chain: list[BaseException], *, tls: bool, timeout_s: float) -> str:
    """A timeout, a lost connection or the server's refusal; else the error as it is."""
    if isinstance(top, TimeoutError | RedisTimeoutError):
        return f"no answer within {timeout_s:g} s"
    if isinstance(top, BusyLoadingError):
        return "the server is loading its data set into memory"
    if any(isinstance(link, ConnectionResetError) for link in chain) and tls:
        return (
            f"the server closed the TLS connection ({top}): does it require a client "
            "certificate (store.tls.cert_file and key_file) signed by a CA it trusts?"
        )
    if isinstance(top, RedisConnectionError):
        return f"cannot connect ({top})"
    if isinstance(top, ReadOnlyError):
        return (
            "the server is a read-only replica (READONLY): point the URL at the master, "
            "or use redis+sentinel:// to find it"
        )
    if isinstance(top, NoPermissionError):
        return f"the user may not run a command taskgate needs ({top})"
    if aof_off(top):
        return f"{AOF_OFF} (it has appendonly no; it said: {top})"
    if isinstance(top, OutOfMemoryError):
        return f"the server is out of memory (OOM {top}; see its maxmemory)"
    if isinstance(top, ResponseError):
        return f"the server refused the command ({top})"
    return f"{type(top).__name__}: {top}"


def _authentication(said: str) -> str:
    lowered = said.lower()
    if "authentication required" in lowered or "already authenticated" in lowered:
        return "the server asks for a password and the URL gives none"
    if "invalid" in lowered or "wrongpass" in lowered:
        return f"the server refused the password ({said})"
    return f"authentication failed ({said})"


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc`, then what caused it: explicitly (`from`) or while it was handled."""
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and all(link is not seen for seen in chain):
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain
