"""`scripts/compile.py --check`, which every benchmark of the compiled build asks first: the
compiled files present are of the sources as they are, or it exits 1 and names the fix. Run on
a small tree of its own (a pyproject.toml naming two modules, their sources, mypyc.ini), as a
subprocess of the script copied there, so that nothing of this checkout's build is touched."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = """[tool.hatch.build.targets.wheel.hooks.mypyc]
include = ["gateway/a.py", "gateway/b.py"]
"""


def tree(tmp: Path) -> Path:
    (tmp / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "compile.py", tmp / "scripts" / "compile.py")
    (tmp / "pyproject.toml").write_text(PYPROJECT)
    (tmp / "mypyc.ini").write_text("[mypy]\n")
    (tmp / "gateway").mkdir()
    for name in ("a", "b"):
        (tmp / "gateway" / f"{name}.py").write_text(f"X = {name!r}\n")
    return tmp


def check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/compile.py", "--check"],
        cwd=root, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def stamped(root: Path) -> None:
    """As a compile leaves it: the stamp of the sources, an extension per module and the
    shared library."""
    code = (
        "import sys; sys.path.insert(0, 'scripts'); import compile as c; "
        "c.STAMP.parent.mkdir(exist_ok=True); c.STAMP.write_text(c.digest(c.modules()))"
    )
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60)
    suffix = EXTENSION_SUFFIXES[0]
    for name in ("a", "b"):
        (root / "gateway" / f"{name}{suffix}").write_bytes(b"")
    (root / f"x__mypyc{suffix}").write_bytes(b"")


def test_check_passes_a_build_of_the_sources_as_they_are(tmp_path: Path) -> None:
    root = tree(tmp_path)
    stamped(root)
    done = check(root)
    assert done.returncode == 0, done.stderr
    assert "up to date" in done.stdout


def test_check_fails_once_a_source_changed_and_when_nothing_was_compiled(tmp_path: Path) -> None:
    root = tree(tmp_path)
    assert check(root).returncode == 1  # never compiled
    stamped(root)
    (root / "gateway" / "b.py").write_text("X = 'edited'\n")
    done = check(root)
    assert done.returncode == 1
    assert "not of these sources" in done.stderr
    assert "make compile" in done.stderr
