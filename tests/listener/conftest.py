"""The listener's scenarios run under asyncio's loop and uvloop alike."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

Scenario = Callable[[], Coroutine[Any, Any, None]]
Run = Callable[[Scenario], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    def runner(scenario: Scenario) -> None:
        if request.param == "uvloop":
            uvloop.run(asyncio.wait_for(scenario(), 15))
        else:
            asyncio.run(asyncio.wait_for(scenario(), 15))

    return runner
