"""Hypothesis profiles: "ci" (the same examples every run, no example database) when the CI
environment variable is set, "dev" (random examples, failures replayed from .hypothesis/)
otherwise. `--hypothesis-profile NAME` still picks either by hand."""

from __future__ import annotations

import os
from collections.abc import Mapping

from hypothesis import HealthCheck, settings

# Tests that name their own max_examples keep it; these bound the others.
CI_MAX_EXAMPLES = 100
DEV_MAX_EXAMPLES = 100


def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    """CI=true (as CI sets it), or any value but empty, 0, false or no."""
    return environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def load_profiles(environ: Mapping[str, str] = os.environ) -> str:
    """Register both profiles and load the one for this environment; its name."""
    # Both start from Hypothesis's own defaults, not from whichever profile is in force (with
    # CI set, Hypothesis has loaded its built-in "ci" at import). No deadline in either: these
    # machines are shared and noisy, and timing claims belong in bench/, never in a test.
    defaults = settings.get_profile("default")
    settings.register_profile("dev", defaults, max_examples=DEV_MAX_EXAMPLES, deadline=None)
    settings.register_profile(
        "ci",
        defaults,
        max_examples=CI_MAX_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    name = "ci" if in_ci(environ) else "dev"
    settings.load_profile(name)
    return name
