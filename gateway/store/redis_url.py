"""Redis store URLs: the four forms, checked strictly and parsed into what redis-py's clients take.

    redis://[[user]:password@]host:port/db         rediss://... (TLS)       unix:///path.sock
    redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]
    redis+cluster://[[user]:password@]host:port[,host:port...]           (seed nodes)

and rediss+sentinel:// and rediss+cluster:// for TLS to every node. No module of redis-py is
imported here: the configuration checks URLs with this module before anything connects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

REDIS_PORT = 6379
SENTINEL_PORT = 26379
STANDALONE_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SCHEMES = STANDALONE_SCHEMES + SENTINEL_SCHEMES + CLUSTER_SCHEMES
TLS_SCHEMES = frozenset({"rediss", "rediss+sentinel", "rediss+cluster"})

_QUERY_SECRET = re.compile(r"(?i)((?:^|[?&;])(?:password|pass|pwd)=)[^&;#]*")
_DIGITS = re.compile(r"[0-9]{1,5}")
_SERVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")

Address = tuple[str, int]


class StoreURLError(ValueError):
    """A store URL that names no Redis; the message names the URL (masked) and what is wrong."""


@dataclass(frozen=True, slots=True)
class StandaloneURL:
    """One server (redis://, rediss://, unix://): redis-py's `from_url` reads it as it is."""

    url: str
    tls: bool


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """A service watched by Sentinels; the credentials are the data nodes' (master, replicas):
    the sentinels themselves are asked without a password."""

    sentinels: tuple[Address, ...]
    service: str
    db: int
    username: str | None
    password: str | None
    tls: bool


@dataclass(frozen=True, slots=True)
class ClusterURL:
    """A Redis Cluster by some of its nodes; redis-py discovers the rest (CLUSTER SLOTS)."""

    nodes: tuple[Address, ...]
    username: str | None
    password: str | None
    tls: bool


RedisURL = StandaloneURL | SentinelURL | ClusterURL


def masked(url: str) -> str:
    """`url` fit to print: the password in it, if any, is `***` (a lone user part too, since
    `redis://secret@host` is a common way to misplace a password), and so is a `password=`
    option."""
    scheme, sep, rest = url.partition("://")
    if sep:
        # The last '@' before any option: a password with an unencoded '/' or '@' in it (a
        # URL that is wrong for that very reason) is masked whole all the same.
        head_end = min((i for i in (rest.find(c) for c in "?#") if i >= 0), default=len(rest))
        at = rest.rfind("@", 0, head_end)
        if at >= 0:
            user, colon, _ = rest[:at].partition(":")
            shown = f"{user}:***" if colon and "/" not in user else "***"
            rest = f"{shown}@{rest[at + 1 :]}"
        url = f"{scheme}{sep}{rest}"
    return _QUERY_SECRET.sub(r"\1***", url)


def scheme_of(url: str) -> str:
    """The scheme, lower-cased; '' when there is none."""
    scheme, sep, _ = url.partition("://")
    return scheme.lower() if sep else ""


def parse_redis_url(url: str) -> RedisURL:
    """The Redis that `url` names; StoreURLError saying what is wrong with it otherwise."""
    scheme = scheme_of(url)
    if scheme in STANDALONE_SCHEMES:
        _check_standalone(url, scheme)
        return StandaloneURL(url, tls=scheme in TLS_SCHEMES)
    if scheme not in SCHEMES:
        raise _wrong(url, f"unsupported scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
    rest = url.partition("://")[2]
    if "?" in rest or "#" in rest:
        raise _wrong(url, "options (?...) and fragments (#...) are not read in this form")
    userinfo, hosts, path = _parts(url, rest)
    username, password = (None, None) if userinfo is None else _credentials(url, userinfo)
    tls = scheme in TLS_SCHEMES
    if scheme in SENTINEL_SCHEMES:
        service, db = _service_and_db(url, path)
        sentinels = _addresses(url, hosts, SENTINEL_PORT, "sentinel")
        return SentinelURL(sentinels, service, db, username, password, tls)
    if path:
        raise _wrong(url, f"a cluster URL ends after its nodes (one database only), not /{path}")
    return ClusterURL(_addresses(url, hosts, REDIS_PORT, "seed node"), username, password, tls)


def _check_standalone(url: str, scheme: str) -> None:
    """What redis-py would otherwise report only when it first connects."""
    rest = url.partition("://")[2]
    options = rest.partition("?")[2].partition("#")[0]
    for option in filter(None, re.split("[&;]", options)):
        if option.lower().startswith("ssl"):
            # redis-py lets a URL option override store.tls, verification included.
            raise _wrong(url, f"TLS is set in store.tls, not by the option {option.split('=')[0]}")
    if scheme == "unix":
        if not rest.partition("?")[0].strip("/"):
            raise _wrong(url, "a unix URL names a socket file: unix:///run/redis.sock")
        return
    _, hosts, path = _parts(url, rest.partition("?")[0].partition("#")[0])
    if "," in hosts:
        raise _wrong(
            url,
            f"{scheme}:// names one server; for several use redis+sentinel:// or redis+cluster://",
        )
    if not hosts:
        raise _wrong(url, "no host")
    _address(url, hosts, REDIS_PORT, "server")
    if path and not _DIGITS.fullmatch(path):
        raise _wrong(url, f"the path is a database number (/0), not /{path}")


def _parts(url: str, rest: str) -> tuple[str | None, str, str]:
    """User info (None without an '@'), hosts and path of what follows the scheme."""
    userinfo, at, after = rest.rpartition("@")
    if not at:
        hosts, _, path = rest.partition("/")
        return None, hosts, path
    if "/" in userinfo:
        raise _wrong(url, "write a '/' in the password as %2F (and '@' as %40, ',' as %2C)")
    hosts, _, path = after.partition("/")
    return userinfo, hosts, path


def _credentials(url: str, userinfo: str) -> tuple[str | None, str | None]:
    user, colon, password = userinfo.partition(":")
    if not colon:
        raise _wrong(url, "write the password as :password@ (or user:password@)")
    if not password:
        raise _wrong(url, "the password after ':' is empty")
    return (unquote(user) or None), unquote(password)


def _service_and_db(url: str, path: str) -> tuple[str, int]:
    service, _, db = path.partition("/")
    if not service:
        raise _wrong(url, "no service name: redis+sentinel://host:port/<service>[/db]")
    if not _SERVICE.fullmatch(service):
        raise _wrong(url, f"{service!r} is not a Sentinel service name")
    if db and not _DIGITS.fullmatch(db):
        raise _wrong(url, f"after the service comes a database number (/0), not /{db}")
    return service, int(db or 0)


def _addresses(url: str, hosts: str, default_port: int, what: str) -> tuple[Address, ...]:
    if not hosts:
        raise _wrong(url, f"no {what}: list them as host:port,host:port")
    found = tuple(_address(url, entry, default_port, what) for entry in hosts.split(","))
    if len(set(found)) != len(found):
        raise _wrong(url, f"a {what} is listed twice")
    return found


def _address(url: str, entry: str, default_port: int, what: str) -> Address:
    if entry.startswith("["):  # [::1]:6379
        host, bracket, port = entry[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            raise _wrong(url, f"{what} {entry!r}: write an IPv6 address as [::1]:port")
        port = port[1:]
    else:
        host, _, port = entry.partition(":")
    if not host:
        raise _wrong(url, f"{what} {entry!r} has no host")
    if not port:
        return host, default_port
    if not _DIGITS.fullmatch(port) or not 0 < int(port) < 65536:
        raise _wrong(url, f"{what} {entry!r}: the port is a number from 1 to 65535")
    return host, int(port)


def _wrong(url: str, what: str) -> StoreURLError:
    return StoreURLError(f"{masked(url)}: {what}")
