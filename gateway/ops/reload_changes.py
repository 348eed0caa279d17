"""What a new configuration changes, in words, and which of its changes a reload cannot apply
(each key named: such a reload is refused, and the running configuration stays)."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel

from gateway.config import Config

# listen.* a reload applies: read by each request, a Guard rebuilt from them, or the
# coordinator's share. The rest built the public listener (its socket, its limits) and change
# only with a restart.
_LISTEN_APPLIED = frozenset(
    {"strict_headers", "allowed_origins", "allowed_hosts", "max_json_depth", "tenant_share"}
)
_ADDRESS = frozenset({"host", "port", "path"})
# auth.* the public listener's RFC 9728 documents were built from (gateway/pipeline/listener.py).
_AUTH_AT_START = frozenset({"mode", "audience", "resource_metadata"})
# Sections whose change a reload applies, named in its changes as they come.
_APPLIED_SECTIONS = ("auth", "discovery", "health", "limits", "subscriptions", "tasks")


def needs_restart(running: Config, new: Config) -> list[str]:
    """What `new` changes that this process cannot apply without a restart, one problem per
    key, in YAML paths."""
    problems: list[str] = []
    for key in _changed(running.listen, new.listen):
        if key in _LISTEN_APPLIED:
            continue
        before, after = getattr(running.listen, key), getattr(new.listen, key)
        why = (
            "the listener's address changes only with a restart"
            if key in _ADDRESS
            else "the public listener was built with it; needs a restart"
        )
        problems.append(f"listen.{key}: {before} -> {after}: {why}")
    if (running.admin is None) != (new.admin is None):
        added = "added" if new.admin is not None else "removed"
        problems.append(f"admin: {added}: the admin listener changes only with a restart")
    elif running.admin is not None and new.admin is not None:
        for key in _changed(running.admin, new.admin):
            before, after = getattr(running.admin, key), getattr(new.admin, key)
            problems.append(
                f"admin.{key}: {before} -> {after}: the admin listener changes only with a restart"
            )
    # No values: a store URL may carry a password.
    problems += [
        f"store.{key}: changed: the task-route store is not reopened by a reload; needs a restart"
        for key in _changed(running.store, new.store)
    ]
    problems += [
        f"auth.{key}: changed: the public listener serves the RFC 9728 metadata it was built "
        "with; needs a restart"
        for key in _changed(running.auth, new.auth)
        if key in _AUTH_AT_START
    ]
    problems += [
        f"logging.{key}: changed: the request log is set up at start; needs a restart"
        for key in _changed(running.logging, new.logging)
    ]
    problems += [
        f"tracing.{key}: changed: tracing is set up at start; needs a restart"
        for key in _changed(running.tracing, new.tracing)
    ]
    if running.legacy.enabled != new.legacy.enabled:
        problems.append(
            "legacy.enabled: changed: the 2025-era front door is built at start; needs a restart"
        )
    return problems


def describe_changes(running: Config, new: Config) -> list[str]:
    """What a reload from `running` to `new` changes, for the log, the history and
    `taskgate reload`; replicas by host:port (a URL's path may hold a secret)."""
    changes: list[str] = []
    for name in sorted(new.backends.keys() - running.backends.keys()):
        count = len(new.backends[name].replicas)
        changes.append(f"backend {name} added ({count} replica{'s' if count > 1 else ''})")
    changes += [
        f"backend {name} removed" for name in sorted(running.backends.keys() - new.backends.keys())
    ]
    for name in sorted(new.backends.keys() & running.backends.keys()):
        before, after = running.backends[name], new.backends[name]
        labels = {url: urlsplit(url).netloc for url in (*before.replicas, *after.replicas)}
        changes += [
            f"backend {name}: replica {labels[url]} added"
            for url in after.replicas
            if url not in before.replicas
        ]
        changes += [
            f"backend {name}: replica {labels[url]} removed"
            for url in before.replicas
            if url not in after.replicas
        ]
        settings = [key for key in _changed(before, after) if key != "replicas"]
        if settings:
            changes.append(f"backend {name}: {', '.join(settings)} changed")
    if running.routes != new.routes:
        changes.append(f"routes changed ({len(running.routes)} -> {len(new.routes)})")
    changes += [f"listen.{key} changed" for key in _changed(running.listen, new.listen)]
    for section in _APPLIED_SECTIONS:
        keys = _changed(getattr(running, section), getattr(new, section))
        if keys:
            changes.append(f"{section}: {', '.join(keys)} changed")
    if not changes:
        changes.append("no change to the configuration (credentials and keys read again)")
    return changes


def _changed(before: BaseModel, after: BaseModel) -> list[str]:
    """The fields of one section that differ, in declaration order."""
    return [key for key in type(before).model_fields if getattr(before, key) != getattr(after, key)]
