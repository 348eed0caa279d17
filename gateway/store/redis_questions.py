"""The questions of 2025-era tasks in Redis: a hash per task, in its route's slot, expiring with
the route."""

from __future__ import annotations

from typing import Any

from gateway.store.keys import questions_key
from gateway.store.redis_link import RedisLink, as_text

# Each question once: a key kept already is left as it was (HSETNX), and the hash lives as
# long as the task's route.
_ADD = """
for i = 2, #ARGV, 2 do
  redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIREAT', KEYS[1], ARGV[1])
return 1
"""


class RedisQuestionStore:
    """A TaskQuestions on a RedisLink it shares (the route store's, which closes it)."""

    def __init__(self, link: RedisLink) -> None:
        self._client = link.client
        self._guard = link.guard
        self._add = self._client.register_script(_ADD)

    async def add_questions(
        self, task_id: str, questions: dict[str, bytes], expires_at_ms: int
    ) -> None:
        if not questions:
            return
        key = questions_key(task_id)
        args: list[Any] = [expires_at_ms]
        for name, question in questions.items():
            args += (name, question)
        await self._guard(self._add(keys=[key], args=args), key)

    async def questions(self, task_id: str) -> dict[str, bytes]:
        key = questions_key(task_id)
        fields = await self._guard(self._client.hgetall(key), key)
        return {as_text(name): _as_bytes(question) for name, question in fields.items()}

    async def answered(self, task_id: str, keys: list[str]) -> None:
        if keys:
            key = questions_key(task_id)
            await self._guard(self._client.hdel(key, *keys), key)


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()
