"""The questions of the 2025-era tasks that wait for input: the server's requests, read from
the task's tasks/result stream by one instance (gateway/bridge/task_input.py), kept here so that
every instance's tasks/get names them and its tasks/update answers them.

A question is kept under the key taskgate gave it (unique for the task's life), as the server's
request message (JSON bytes), until it is answered or the task's route expires. Only what the
route's owner check let through reaches these: the store checks nothing of its own."""

from __future__ import annotations

from typing import Protocol


class TaskQuestions(Protocol):
    """The questions of tasks that wait for input, by task id and key."""

    async def add_questions(
        self, task_id: str, questions: dict[str, bytes], expires_at_ms: int
    ) -> None:
        """Keep `questions` (key -> the server's request) of the task until `expires_at_ms`;
        a key kept already stays as it was."""
        ...

    async def questions(self, task_id: str) -> dict[str, bytes]:
        """The task's questions not answered yet, by key."""
        ...

    async def answered(self, task_id: str, keys: list[str]) -> None:
        """Forget the questions under `keys`: they were answered."""
        ...
