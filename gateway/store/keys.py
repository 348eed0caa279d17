"""Every Redis key taskgate writes, in one place."""

from __future__ import annotations

PREFIX = "taskgate"


def route_key(task_id: str) -> str:
    """The hash of one task route. The braces are a Redis Cluster hash tag: everything taskgate
    ever keeps about one task lands in one slot, so per-task scripts stay single-slot."""
    return f"{PREFIX}:route:{{{task_id}}}"


def legacy_session_key(owner: str, session_id: str) -> str:
    """The hash of one 2025-era session. Its owner is the hash tag, not its id: an owner's
    sessions and their set (legacy_owner_key) share one slot, so the owner limit is one
    single-slot script and exact."""
    return legacy_session_prefix(owner) + session_id


def legacy_session_prefix(owner: str) -> str:
    """What every one of the owner's session keys begins with: the owner's script names the
    sessions it evicts from their ids in the owner's set (all of them on the owner's slot)."""
    return f"{PREFIX}:ls:{{{owner}}}:"


def legacy_owner_key(owner: str) -> str:
    """The sorted set of one owner's session ids, scored by their expiry."""
    return f"{PREFIX}:lo:{{{owner}}}"


# Every session id, scored by its expiry: the store-wide count. One key, so one slot, apart
# from the owners': it is written by commands of its own, after the owner's script.
LEGACY_ALL_KEY = f"{PREFIX}:lall"


def questions_key(task_id: str) -> str:
    """The hash of a 2025-era task's questions waiting for answers (key -> the server's
    request), in the slot of the task's route (the same hash tag)."""
    return f"{PREFIX}:questions:{{{task_id}}}"


def made_key(task_id: str) -> str:
    """The hash of one task taskgate runs (gateway/store/made.py), tagged by its id."""
    return f"{PREFIX}:made:{{{task_id}}}"


def made_answers_key(task_id: str) -> str:
    """The answers to a made task's questions that its holder has not taken, in its slot."""
    return f"{PREFIX}:made-answers:{{{task_id}}}"


def made_owner_key(tenant: str, principal: str) -> str:
    """The sorted set of one owner's made task ids, scored by their expiry (the owner's limit).
    The tenant's length first, so that no tenant and principal pair spells another's."""
    return f"{PREFIX}:mo:{{{len(tenant)}:{tenant}:{principal}}}"


# Every made task's id, scored by its expiry: the store-wide count.
MADE_ALL_KEY = f"{PREFIX}:mall"


def limit_key(tenant: str, key: str) -> str:
    """One of a tenant's limit buckets or counts (gateway/store/redis_limits.py): the tenant is
    the hash tag, so a request's keys share a slot; its length first, as in made_owner_key."""
    return f"{PREFIX}:lim:{{{len(tenant)}:{tenant}}}:{key}"
