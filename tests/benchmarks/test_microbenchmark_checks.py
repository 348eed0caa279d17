"""The microbenchmarks' own assertions (bench/micro) hold: every case runs once, untimed.

bench/micro is run by hand for its numbers (`pytest bench/micro`); its cases also assert that
what they measure is right (the parsed name, the verified principal, the resolved route). This
runs them in `make test`, with pytest-benchmark's timing off and the 1,000,000-route cases
(marked `large`, minutes of filling) left out, in a pytest of their own: bench/micro has its
own conftest and fixtures, and its command line stays as docs/performance.md gives it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH_RUN_TIMEOUT_S = 100  # about 3 s on the 2-core machine; pytest-timeout's 120 s is above


def test_the_microbenchmarks_checks_pass_with_timing_turned_off() -> None:
    command = [
        *(sys.executable, "-m", "pytest", "bench/micro"),
        *("--benchmark-disable", "-m", "not large"),
        *("-q", "--no-header", "-p", "no:cacheprovider"),
    ]
    run = subprocess.run(
        command,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=BENCH_RUN_TIMEOUT_S,
        check=False,
    )
    output = run.stdout + run.stderr
    # 0 only if cases ran and all passed (pytest exits 5 when it collected none).
    assert run.returncode == 0, f"pytest bench/micro exited {run.returncode}:\n{output}"
    assert " passed" in output, output
