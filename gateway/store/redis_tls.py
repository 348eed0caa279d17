"""One TLS context per set of files for every connection redis-py opens, instead of one each.

redis-py's asyncio client builds a new `ssl.SSLContext` for every connection it opens
(`SSLConnection` makes a `RedisSSLContext` of its own), and `ssl.create_default_context()`
loads the system's trust store each time, even when a CA file is given: 29 ms of CPU per
connection on this project's test machine, in the event loop. A pool filling up at a burst (up
to store.max_connections, 256) held every request of the process for seconds; twenty operations
at once on a new TLS store took 0.6-2.1 s instead of 0.09 s, and timed out under load in CI.

`install()` puts `SharedSSLContext` in redis-py's place (the one name `SSLConnection` builds
from), for every topology at once: standalone, Sentinel (its sentinels and its master) and
cluster. Contexts are shared by what makes them (the options and each file's identity: inode,
size and modification time), so a rotated certificate or CA file is read at the next new
connection, as redis-py does, and a process holds a few contexts at most (`MAX_CONTEXTS`).
It also keeps the documented meaning of `store.tls.ca_file`: when given, that CA alone is
trusted, not the system's CAs besides it.
"""

from __future__ import annotations

import os
import ssl
import threading
from collections import OrderedDict
from collections.abc import Hashable

import redis.asyncio.connection as redis_connection
from redis.asyncio.connection import RedisSSLContext

# Distinct sets of files in one process: one store's, a rotation's old and new, tests' own.
MAX_CONTEXTS = 8

_made: OrderedDict[Hashable, ssl.SSLContext] = OrderedDict()
_lock = threading.Lock()  # redis-py's sync clients in other threads share the name


class SharedSSLContext(RedisSSLContext):
    """redis-py's RedisSSLContext, whose context is the process's one for the same files."""

    __slots__ = ()

    def get(self) -> ssl.SSLContext:
        if self.context is None:
            self.context = _shared(self)
        return self.context


def install() -> None:
    """Make every redis-py asyncio TLS connection opened from now on share contexts."""
    redis_connection.RedisSSLContext = SharedSSLContext  # type: ignore[misc]


def _shared(options: RedisSSLContext) -> ssl.SSLContext:
    key = _key(options)
    with _lock:
        made = _made.get(key)
        if made is not None:
            _made.move_to_end(key)
            return made
    made = _build(options)
    with _lock:
        _made[key] = made
        while len(_made) > MAX_CONTEXTS:
            _made.popitem(last=False)
    return made


def _key(options: RedisSSLContext) -> Hashable:
    return (
        _stamp(options.certfile),
        _stamp(options.keyfile),
        _stamp(options.ca_certs),
        options.ca_path,
        options.ca_data,
        options.cert_reqs,
        tuple(options.include_verify_flags or ()),
        tuple(options.exclude_verify_flags or ()),
        options.check_hostname,
        options.min_version,
        options.ciphers,
        options.password,
    )


def _stamp(path: str | None) -> Hashable:
    """A file's identity: a new one (a rotation) makes a new context; None for a missing file,
    whose error the build reports as redis-py would."""
    if path is None:
        return None
    try:
        seen = os.stat(path)
    except OSError:
        return (path, None)
    return (path, seen.st_ino, seen.st_size, seen.st_mtime_ns)


def _build(options: RedisSSLContext) -> ssl.SSLContext:
    """What redis-py's RedisSSLContext.get builds, but trusting the given CA alone when one is
    given (create_default_context loads the system's CAs only when none is)."""
    context = ssl.create_default_context(
        cafile=options.ca_certs, capath=options.ca_path, cadata=options.ca_data
    )
    context.check_hostname = options.check_hostname
    context.verify_mode = options.cert_reqs
    for flag in options.include_verify_flags or ():
        context.verify_flags |= flag
    for flag in options.exclude_verify_flags or ():
        context.verify_flags &= ~flag
    if options.certfile or options.keyfile:
        context.load_cert_chain(
            certfile=options.certfile,  # type: ignore[arg-type]
            keyfile=options.keyfile,
            password=options.password,
        )
    if options.min_version is not None:
        context.minimum_version = options.min_version
    if options.ciphers is not None:
        context.set_ciphers(options.ciphers)
    return context
