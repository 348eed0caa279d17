"""What can be a task id at all (gateway.protocol.tasks.valid_task_id): a string of 1 to 256
visible ASCII characters; anything else is answered as an unknown task before any lookup."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from gateway.protocol.tasks import MAX_TASK_ID_LENGTH, valid_task_id

# The rule as first written, which valid_task_id keeps by cheaper means.
TASK_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_TASK_ID_LENGTH}}}")
# Every class of character the rule tells apart, around its edges.
_chars = st.sampled_from(["a", "!", "~", "-", " ", "\t", "\n", "\x00", "\x7f", "é", "\udc80"])


@given(value=st.text(alphabet=_chars, max_size=8))
def test_an_id_is_valid_exactly_when_it_is_visible_ascii(value: str) -> None:
    assert valid_task_id(value) == (TASK_ID.fullmatch(value) is not None)


def test_an_id_is_bounded_in_length_and_must_be_a_string() -> None:
    assert valid_task_id("x" * MAX_TASK_ID_LENGTH)
    assert not valid_task_id("x" * (MAX_TASK_ID_LENGTH + 1))
    assert not valid_task_id("")
    for other in (None, 7, b"abc", ["abc"]):
        assert not valid_task_id(other)
