"""Node.js client projects under tests/clients/: Node and npm found and checked, the pinned npm
packages installed with `npm ci` when node_modules lacks them, and child processes run to their
end within a time limit.

A missing or too old Node, or a failed install, is not a skip: each test that needs the project
fails with the reason (`NodeProject.require`), so that a CI machine without Node cannot pass
these tests by not running them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

MIN_NODE_MAJOR = 20
NPM_CI_TIMEOUT_S = 300.0
PROBE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Finished:
    """A child process that has exited (or was killed at its time limit), with all it wrote."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def describe(self) -> str:
        end = "killed at its time limit" if self.timed_out else f"exit status {self.returncode}"
        command = " ".join(self.argv)
        return f"{command}: {end}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


async def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    limit_s: float,
    env: Mapping[str, str] | None = None,
) -> Finished:
    """Run `argv` in `cwd` to its end, or past `limit_s` seconds kill it: its whole process
    group, since npm and npx have children of their own."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=None if env is None else dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    timed_out = False
    stdout = stderr = b""
    try:
        async with asyncio.timeout(limit_s):
            stdout, stderr = await proc.communicate()
    except TimeoutError:
        timed_out = True
    finally:
        # Also on cancellation: the child never outlives the test.
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = await proc.communicate()
    assert proc.returncode is not None
    return Finished(
        argv=tuple(argv),
        returncode=proc.returncode,
        stdout=stdout.decode(errors="replace"),
        stderr=stderr.decode(errors="replace"),
        timed_out=timed_out,
    )


def pinned_version(directory: Path, package: str) -> str:
    """The exact version package.json pins `package` to."""
    manifest = json.loads((directory / "package.json").read_text())
    version: str = manifest["dependencies"][package]
    return version


def installed_version(directory: Path, package: str) -> str | None:
    """The version of `package` in node_modules, or None when it is not there."""
    manifest = directory / "node_modules" / package / "package.json"
    if not manifest.is_file():
        return None
    version: str = json.loads(manifest.read_text())["version"]
    return version


def _mismatched(directory: Path, packages: Sequence[str]) -> list[str]:
    """The packages whose installed version is not the pinned one, as `name: have != pinned`."""
    wrong = []
    for package in packages:
        have, pinned = installed_version(directory, package), pinned_version(directory, package)
        if have != pinned:
            wrong.append(f"{package}: {have} != {pinned}")
    return wrong


@dataclass(frozen=True)
class NodeProject:
    """A project under tests/clients/ ready to run, or why it is not."""

    directory: Path
    node: str | None
    problem: str | None

    def require(self) -> str:
        """The node executable; the calling test fails (not skips) when the project is not
        ready."""
        if self.node is None or self.problem is not None:
            pytest.fail(self.problem or "node is missing", pytrace=False)
        return self.node

    def bin(self, name: str) -> Path:
        """An executable the project's packages installed (node_modules/.bin), so that nothing
        is downloaded when a test runs it."""
        self.require()
        path = self.directory / "node_modules" / ".bin" / name
        if not path.is_file():
            pytest.fail(f"{path} is missing after npm ci", pytrace=False)
        return path


def _stamp(directory: Path) -> Path:
    """Written by prepare_node_project after `npm ci` succeeds, holding the lockfile's digest:
    npm writes package.json files while it extracts, so a package's version alone cannot tell a
    finished install from one another worker is still making (or one that was killed)."""
    return directory / "node_modules" / ".taskgate-installed"


def _lock_digest(directory: Path) -> str:
    return hashlib.sha256((directory / "package-lock.json").read_bytes()).hexdigest()


def _installed(directory: Path, packages: Sequence[str]) -> bool:
    """Whether the last `npm ci` here finished for this lockfile and left the pinned versions."""
    stamp = _stamp(directory)
    finished = stamp.is_file() and stamp.read_text() == _lock_digest(directory)
    return finished and not _mismatched(directory, packages)


def _locked(path: Path) -> int:
    """A descriptor of `path` (made if missing) holding an exclusive lock on it."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    return descriptor


async def prepare_node_project(directory: Path, packages: Sequence[str]) -> NodeProject:
    """Check Node (>= MIN_NODE_MAJOR, with npm), and run `npm ci` in `directory` unless each of
    `packages` is installed at the version its package.json pins. Never raises for a missing
    Node or a failed install: the problem is returned, for each test to fail with."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing = "node" if node is None else "npm"
        problem = (
            f"Node.js >= {MIN_NODE_MAJOR} with npm is required for the clients in {directory}: "
            f"{missing} is not on PATH"
        )
        return NodeProject(directory, None, problem)
    probe = await run_process([node, "--version"], cwd=directory, limit_s=PROBE_TIMEOUT_S)
    version = probe.stdout.strip()
    major = re.fullmatch(r"v(\d+)\.\d+\.\d+", version)
    if not probe.ok or major is None or int(major[1]) < MIN_NODE_MAJOR:
        problem = (
            f"Node.js >= {MIN_NODE_MAJOR} is required for the clients in {directory}; "
            f"{node} is {version!r}"
        )
        return NodeProject(directory, node, problem)
    # Test files run at once in several workers may need one project: one installs it, the
    # others wait on the lock and then find it installed. The check is made under the lock
    # too, never before it: a worker that looked while another's `npm ci` was extracting
    # would find package.json files and no code beside them.
    lock = await asyncio.to_thread(_locked, directory / ".npm-ci.lock")
    try:
        if not _installed(directory, packages):
            _stamp(directory).unlink(missing_ok=True)
            npm_ci = await run_process(
                [npm, "ci", "--no-audit", "--no-fund"], cwd=directory, limit_s=NPM_CI_TIMEOUT_S
            )
            if not npm_ci.ok:
                return NodeProject(
                    directory, node, f"npm ci in {directory} failed: {npm_ci.describe()}"
                )
            if still := _mismatched(directory, packages):
                problem = f"npm ci in {directory} did not install the pinned versions: {still}"
                return NodeProject(directory, node, problem)
            _stamp(directory).write_text(_lock_digest(directory))
    finally:
        os.close(lock)  # and with it the lock
    return NodeProject(directory, node, None)
