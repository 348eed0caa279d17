"""The tasks taskgate runs, in Redis: a hash per task and a hash of its answers waiting for the
holder, both in the task's slot and expiring with it; every change a script that compares
first, so that a holder that lost its task writes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from redis.commands.core import AsyncScript

from gateway.store.keys import MADE_ALL_KEY, made_answers_key, made_key, made_owner_key
from gateway.store.made import (
    CANCELLED,
    FAILED,
    HOLDER_STOPPED,
    INPUT_REQUIRED,
    WORKING,
    MadeTask,
    Quota,
    Renewed,
)
from gateway.store.made_wire import holder_stopped_outcome
from gateway.store.redis_link import RedisLink, as_text

Durably = Callable[[AsyncScript, str, list[Any]], Awaitable[Any]]

_LIVE = f"(s == '{WORKING}' or s == '{INPUT_REQUIRED}')"

# One more id in a sorted set of ids scored by expiry, unless it holds `limit` live ones already
# (0: no limit); the set lives as long as its longest-lived id.
_ADMIT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local limit = tonumber(ARGV[2])
if limit > 0 and redis.call('ZCARD', KEYS[1]) >= limit then return 0 end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[3])
local left = redis.call('PTTL', KEYS[1])
if left < 0 or tonumber(ARGV[1]) + left < tonumber(ARGV[4]) then
  redis.call('PEXPIREAT', KEYS[1], ARGV[4])
end
return 1
"""
_CREATE = """
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIREAT', KEYS[1], ARGV[1])
return 1
"""
# As task routes' lookup: another owner's id and an absent one get the same empty reply.
_GET_OWNED = """
local owner = redis.call('HMGET', KEYS[1], 'tenant', 'principal')
if owner[1] ~= ARGV[1] or (ARGV[3] == '1' and owner[2] ~= ARGV[2]) then return {} end
return redis.call('HGETALL', KEYS[1])
"""
_RENEW = f"""
local f = redis.call('HMGET', KEYS[1], 'status', 'holder', 'cancel_requested')
local s = f[1]
if f[2] ~= ARGV[1] or not {_LIVE} then return {{0}} end
redis.call('HSET', KEYS[1], 'lease_until_ms', ARGV[2])
return {{1, f[3], redis.call('HGETALL', KEYS[2])}}
"""
_SET_INPUTS = f"""
local f = redis.call('HMGET', KEYS[1], 'status', 'holder')
local s = f[1]
if f[2] ~= ARGV[1] or not {_LIVE} then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'inputs', ARGV[3], 'updated_at_ms', ARGV[4])
for i = 5, #ARGV do redis.call('HDEL', KEYS[2], ARGV[i]) end
return 1
"""
# Only keys the task asks now, and each once: cjson reads the questions' keys.
_ANSWER = f"""
local f = redis.call('HMGET', KEYS[1], 'status', 'inputs')
if f[1] ~= '{INPUT_REQUIRED}' then return 0 end
local asked = cjson.decode(f[2])
for i = 2, #ARGV, 2 do
  if asked[ARGV[i]] ~= nil then redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1]) end
end
redis.call('PEXPIREAT', KEYS[2], ARGV[1])
return 1
"""
_FINISH = f"""
local f = redis.call('HMGET', KEYS[1], 'status', 'holder')
local s = f[1]
if f[2] ~= ARGV[1] or not {_LIVE} then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'outcome', ARGV[3], 'status_message', ARGV[4],
  'updated_at_ms', ARGV[5], 'inputs', '', 'holder', '')
redis.call('DEL', KEYS[2])
return 1
"""
# A task nobody runs any more is cancelled here; a held one is flagged for its holder.
_CANCEL = f"""
local f = redis.call('HMGET', KEYS[1], 'status', 'lease_until_ms')
local s = f[1]
if not {_LIVE} then return 0 end
if tonumber(f[2]) < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'status', '{CANCELLED}', 'updated_at_ms', ARGV[1], 'inputs', '',
    'holder', '')
  redis.call('DEL', KEYS[2])
  return 2
end
redis.call('HSET', KEYS[1], 'cancel_requested', '1')
return 1
"""
_LAPSE = f"""
local f = redis.call('HMGET', KEYS[1], 'status', 'lease_until_ms')
local s = f[1]
if not {_LIVE} or tonumber(f[2]) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'status', '{FAILED}', 'outcome', ARGV[2], 'status_message', ARGV[3],
  'updated_at_ms', ARGV[1], 'inputs', '', 'holder', '')
redis.call('DEL', KEYS[2])
return 1
"""
_COUNT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
return redis.call('ZCARD', KEYS[1])
"""


class RedisMadeTaskStore:
    """A MadeTaskStore on a RedisLink it shares (the route store's, which closes it); a
    creation is as durable as the route store's records (its `durably`)."""

    def __init__(self, link: RedisLink, durably: Durably) -> None:
        client = link.client
        self._client = client
        self._guard = link.guard
        self._durably = durably
        self._admit = client.register_script(_ADMIT)
        self._create = client.register_script(_CREATE)
        self._get_owned = client.register_script(_GET_OWNED)
        self._renew = client.register_script(_RENEW)
        self._set_inputs = client.register_script(_SET_INPUTS)
        self._answer = client.register_script(_ANSWER)
        self._finish = client.register_script(_FINISH)
        self._cancel = client.register_script(_CANCEL)
        self._lapse = client.register_script(_LAPSE)
        self._count = client.register_script(_COUNT)

    async def create(self, task: MadeTask, *, per_principal: int, total: int) -> None:
        # The owner's count, then the store's, then the record: three slots on a cluster, so
        # three scripts. An admission whose record is never written holds its place until the
        # ttl it was given, which only errs towards the limit.
        task_id, expires = task.task_id, task.expires_at_ms
        owner = made_owner_key(task.tenant, task.principal)
        now = task.created_at_ms
        if not await self._run(self._admit, [owner], [now, per_principal, task_id, expires]):
            raise Quota("per principal", per_principal)
        if not await self._run(self._admit, [MADE_ALL_KEY], [now, total, task_id, expires]):
            raise Quota("in total", total)
        await self._durably(self._create, made_key(task_id), [expires, *_fields(task)])

    async def lookup(self, task_id: str) -> MadeTask | None:
        key = made_key(task_id)
        fields = await self._guard(self._client.hgetall(key), key)
        flat = [item for pair in fields.items() for item in pair]
        return _task(task_id, flat) if flat else None

    async def get_owned(self, task_id: str, tenant: str, principal: str | None) -> MadeTask | None:
        args = [tenant, principal or "", "0" if principal is None else "1"]
        fields = await self._run(self._get_owned, [made_key(task_id)], args)
        return _task(task_id, fields) if fields else None

    async def renew(self, holder: str, task_ids: list[str], lease_until_ms: int) -> list[Renewed]:
        # One script a task, all at once: each task's keys are in a slot of their own.
        replies = await asyncio.gather(
            *(
                self._run(self._renew, _keys(task_id), [holder, lease_until_ms])
                for task_id in task_ids
            )
        )
        return [_renewed(reply) for reply in replies]

    async def set_inputs(
        self, task_id: str, holder: str, inputs: bytes, taken: list[str], now_ms: int
    ) -> bool:
        status = INPUT_REQUIRED if inputs else WORKING
        args = [holder, status, inputs, now_ms, *taken]
        return bool(await self._run(self._set_inputs, _keys(task_id), args))

    async def answer(self, task_id: str, answers: dict[str, bytes], expires_at_ms: int) -> None:
        args: list[Any] = [expires_at_ms]
        for key, answer in answers.items():
            args += (key, answer)
        await self._run(self._answer, _keys(task_id), args)

    async def finish(
        self, task_id: str, holder: str, status: str, outcome: bytes, message: str, now_ms: int
    ) -> bool:
        args = [holder, status, outcome, message, now_ms]
        return bool(await self._run(self._finish, _keys(task_id), args))

    async def request_cancel(self, task_id: str, now_ms: int) -> None:
        await self._run(self._cancel, _keys(task_id), [now_ms])

    async def lapse(self, task_id: str, now_ms: int) -> bool:
        args = [now_ms, holder_stopped_outcome(), HOLDER_STOPPED]
        return bool(await self._run(self._lapse, _keys(task_id), args))

    async def count(self, now_ms: int) -> int:
        return int(await self._run(self._count, [MADE_ALL_KEY], [now_ms]))

    async def _run(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        return await self._guard(script(keys=keys, args=args), keys[0])


def _keys(task_id: str) -> list[str]:
    return [made_key(task_id), made_answers_key(task_id)]


def _fields(task: MadeTask) -> list[Any]:
    return [
        "tenant", task.tenant,
        "principal", task.principal,
        "backend", task.backend,
        "tool", task.tool,
        "status", task.status,
        "created_at_ms", task.created_at_ms,
        "updated_at_ms", task.updated_at_ms,
        "ttl_ms", task.ttl_ms,
        "poll_interval_ms", task.poll_interval_ms,
        "holder", task.holder,
        "lease_until_ms", task.lease_until_ms,
        "status_message", task.status_message,
        "cancel_requested", int(task.cancel_requested),
        "outcome", task.outcome,
        "inputs", task.inputs,
    ]  # fmt: skip


def _task(task_id: str, raw: Any) -> MadeTask | None:
    """A record from a script's flat list of fields; None if the hash is not one."""
    pairs = dict(zip(raw[::2], raw[1::2], strict=True))
    fields = {as_text(k): v for k, v in pairs.items()}
    text = {k: as_text(v) for k, v in fields.items() if k not in ("outcome", "inputs")}
    try:
        return MadeTask(
            task_id=task_id,
            tenant=text["tenant"],
            principal=text["principal"],
            backend=text["backend"],
            tool=text["tool"],
            status=text["status"],
            created_at_ms=int(text["created_at_ms"]),
            updated_at_ms=int(text["updated_at_ms"]),
            ttl_ms=int(text["ttl_ms"]),
            poll_interval_ms=int(text["poll_interval_ms"]),
            holder=text["holder"],
            lease_until_ms=int(text["lease_until_ms"]),
            status_message=text["status_message"],
            cancel_requested=text["cancel_requested"] == "1",
            outcome=_bytes(fields.get("outcome")),
            inputs=_bytes(fields.get("inputs")),
        )
    except (KeyError, ValueError):
        return None


def _renewed(reply: Any) -> Renewed:
    if not reply or int(reply[0]) != 1:
        return Renewed(held=False)
    flat = reply[2]
    answers = {as_text(k): _bytes(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}
    return Renewed(held=True, cancel_requested=as_text(reply[1]) == "1", answers=answers)


def _bytes(value: Any) -> bytes:
    if value is None:
        return b""
    return value if isinstance(value, bytes) else str(value).encode()
