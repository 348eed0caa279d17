"""One contract for the questions of 2025-era tasks waiting for input, every store (SQLite and
each Redis topology): kept by task and key, each once, until answered or expired."""

from __future__ import annotations

from gateway.store.base import now_ms
from gateway.store.questions import TaskQuestions

ELICIT = b'{"jsonrpc":"2.0","id":7,"method":"elicitation/create","params":{"message":"?"}}'
SAMPLE = b'{"jsonrpc":"2.0","id":8,"method":"sampling/createMessage","params":{}}'


async def test_questions_are_kept_by_task_until_answered(questions: TaskQuestions) -> None:
    later = now_ms() + 60_000
    await questions.add_questions("task-1", {"q-7": ELICIT}, later)
    await questions.add_questions("task-1", {"q-8": SAMPLE}, later)
    await questions.add_questions("task-2", {"q-7": SAMPLE}, later)
    assert await questions.questions("task-1") == {"q-7": ELICIT, "q-8": SAMPLE}
    await questions.answered("task-1", ["q-7", "never-asked"])
    assert await questions.questions("task-1") == {"q-8": SAMPLE}
    assert await questions.questions("task-2") == {"q-7": SAMPLE}
    assert await questions.questions("unknown") == {}


async def test_a_question_kept_already_stays_as_it_was(questions: TaskQuestions) -> None:
    later = now_ms() + 60_000
    await questions.add_questions("task-1", {"q-7": ELICIT}, later)
    await questions.add_questions("task-1", {"q-7": SAMPLE}, later)  # read twice: no change
    assert await questions.questions("task-1") == {"q-7": ELICIT}


async def test_questions_expire_with_their_task(questions: TaskQuestions) -> None:
    await questions.add_questions("task-1", {"q-7": ELICIT}, now_ms() - 1)
    assert await questions.questions("task-1") == {}
