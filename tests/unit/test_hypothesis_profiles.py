"""Property tests run the same examples on every CI run, and random ones on a developer's."""

from __future__ import annotations

import pytest
from hypothesis import settings

from tests.support.hypothesis_profiles import CI_MAX_EXAMPLES, in_ci


def test_the_ci_profile_is_derandomized_bounded_and_keeps_no_example_database() -> None:
    ci = settings.get_profile("ci")
    assert (ci.derandomize, ci.database, ci.max_examples) == (True, None, CI_MAX_EXAMPLES)
    assert ci.deadline is None


def test_the_dev_profile_draws_random_examples() -> None:
    assert settings.get_profile("dev").derandomize is False


@pytest.mark.parametrize(
    ("value", "ci"),
    [("true", True), ("1", True), ("yes", True), ("", False), ("false", False), ("0", False)],
)
def test_ci_is_recognised_by_its_environment_variable(value: str, ci: bool) -> None:
    assert in_ci({"CI": value}) is ci
    assert in_ci({}) is False


def test_the_profile_in_force_is_the_one_for_this_environment(
    pytestconfig: pytest.Config,
) -> None:
    chosen = pytestconfig.getoption("hypothesis_profile")  # --hypothesis-profile wins
    expected = chosen or ("ci" if in_ci() else "dev")
    assert settings.get_current_profile_name() == expected
