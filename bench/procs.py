"""Processes a benchmark starts on loopback and stops by pid."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from tests.support.procs import free_ports as free_ports  # re-exported for bench modules

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 60.0
BUILDS = ("compiled", "pure")  # taskgate's two builds of one source, in the order measured
VERSION_TIMEOUT_S = 60


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not): what a run checks it left nothing behind with."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def free_port() -> int:
    (port,) = free_ports(1)
    return port


def wait_port(port: int, proc: subprocess.Popen[bytes], within: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listened on {port} within {within:g} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def started(
    argv: list[str], port: int, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` in `cwd` until the block ends; it is ready once `port` accepts connections.
    `env` is its whole environment (default: this process's)."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 - it outlives this statement, closed below
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=log,
        stdin=subprocess.DEVNULL,
        env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
    )
    try:
        wait_port(port, proc)
        yield proc
    except RuntimeError:
        log.seek(0)
        sys.stderr.write(log.read().decode(errors="replace")[-4000:])
        raise
    finally:
        stop(proc)
        log.close()


def backend(
    port: int, name: str = "b1"
) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    argv = [sys.executable, "-m", "backends.report", "--port", str(port), "--replica", name]
    return started(argv, port)


def instant_backend(
    port: int, *, tasks: bool = True
) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    argv = [sys.executable, "-m", "bench.instant_backend", "--port", str(port)]
    return started(argv if tasks else [*argv, "--no-tasks"], port)


def redis(port: int, directory: Path) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory)]
    argv += ["--save", "", "--appendonly", "no"]
    return started(argv, port)


def taskgate(config: Path, port: int) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    argv = [
        sys.executable,
        "-m",
        "gateway",
        "run",
        "--config",
        str(config),
        "--log-level",
        "warning",
    ]
    return started(argv, port)


# --- taskgate's builds --------------------------------------------------------------------


def compiled_present() -> bool:
    """Whether this checkout holds the compiled build: gateway/h1/server's extension, the module
    gateway/_build.py asks which build runs."""
    return any((ROOT / "gateway" / "h1").glob("server*.so"))


def build_env(build: str) -> dict[str, str]:
    """The environment a taskgate process of `build` runs in: this one's, with TASKGATE_PURE=1
    for the pure build and without TASKGATE_PURE for the compiled one (inherited, it would turn
    the compiled build pure)."""
    found = {name: value for name, value in os.environ.items() if name != "TASKGATE_PURE"}
    if build == "pure":
        found["TASKGATE_PURE"] = "1"
    return found


def build_version(build: str, env: dict[str, str]) -> str:
    """`python -m gateway --version` run with `env`: its line, which must name `build` (else
    SystemExit: one build measured under the other's name would be a false comparison)."""
    if build == "compiled":
        check_compiled_current()
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "--version"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env=env,
        timeout=VERSION_TIMEOUT_S,
    )
    lines = (done.stdout + done.stderr).strip().splitlines()
    line = lines[0].strip() if lines else ""
    says = {"compiled": "compiled with mypyc", "pure": "pure Python"}[build]
    if done.returncode != 0 or says not in line:
        raise SystemExit(
            f"taskgate labelled {build}: `python -m gateway --version` with its environment "
            f"exited {done.returncode} saying {line!r}, not {says!r}; not measuring it"
        )
    return line


def compiled_files_mapped(pids: list[int], root: Path = ROOT) -> list[str]:
    """The compiled files of the checkout at `root` (gateway/**/*.so, mypyc's shared library
    at its root) that the processes `pids` (a taskgate and its workers) have mapped, from
    /proc/<pid>/maps."""
    package, found = f"{root / 'gateway'}/", set()
    for member in pids:
        try:
            maps = Path(f"/proc/{member}/maps").read_text()
        except OSError:  # it exited meanwhile
            continue
        for line in maps.splitlines():
            fields = line.split(maxsplit=5)
            path = fields[5] if len(fields) == 6 else ""
            if not path.endswith(tuple(EXTENSION_SUFFIXES)):
                continue
            ours = path.startswith(package) or (
                Path(path).parent == root and "__mypyc" in Path(path).name
            )
            if ours:
                found.add(str(Path(path).relative_to(root)))
    return sorted(found)


def check_compiled_current(root: Path = ROOT) -> None:
    """The compiled build of the checkout at `root` is of its sources as they are (its
    scripts/compile.py --check), else SystemExit: an edit since the last `make compile` runs
    the old code under the new name. A checkout whose compile.py has no --check yet is taken
    as it is."""
    script = root / "scripts" / "compile.py"
    if "--check" not in script.read_text():
        return
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True,
                          text=True, check=False, cwd=root, timeout=VERSION_TIMEOUT_S)  # fmt: skip
    if done.returncode != 0:
        said = (done.stdout + done.stderr).strip()
        raise SystemExit(f"{root}: {said}; not measuring it")


def check_running_build(build: str, files: list[str]) -> None:
    """A started taskgate runs `build`: the compiled one has gateway/h1/server's extension
    mapped, the pure one no compiled file of taskgate at all; else SystemExit."""
    server = any(name.startswith("gateway/h1/server") for name in files)
    if (build == "compiled" and not server) or (build == "pure" and files):
        shown = ", ".join(files[:5]) or "none"
        raise SystemExit(
            f"taskgate labelled {build} has mapped these compiled files: {shown}; not measuring it"
        )
