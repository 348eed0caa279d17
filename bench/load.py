"""Load generation shared by the benchmarks: wrk with checked responses, CPU from /proc.

One MCP request (`Request`) is sent again and again by wrk (Debian's package) through
bench/wrk/mcp.lua, which checks every response; `drive` runs an unrecorded warm-up, then the
measured run, and fails loudly (SystemExit) on any response that is not the expected answer.
Around the measured run it reads the CPU time of the processes named to it (each with its
descendants: nginx's workers, taskgate's) from /proc, wrk's from getrusage, and the whole
machine's from /proc/stat: what is left is what other processes used meanwhile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import os
import platform
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import aiohttp
import orjson

from bench import procs

LUA = procs.ROOT / "bench" / "wrk" / "mcp.lua"
PROTOCOL = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": PROTOCOL,
    "io.modelcontextprotocol/clientCapabilities": {
        "extensions": {"io.modelcontextprotocol/tasks": {}}
    },
}
CPUS = os.cpu_count() or 1
NOISY = 0.10  # other processes' share of the machine above which a run is marked
WRK_TIMEOUT_S = 5


# --- the request --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Request:
    """One MCP request, as wrk sends it (bench/wrk/mcp.lua) and as `check` sends it once.

    With `session`, a 2025-era request on that session (bench/legacy.py): its body has no
    params._meta, Mcp-Session-Id goes with it and neither Mcp-Method nor Mcp-Name does, as a
    2025-era client sends it; `version` is then its session's revision."""

    method: str
    params: dict[str, Any]
    name: str = ""  # Mcp-Name: the tool's name or the task's id
    expect: str = ""  # text every good answer holds besides "result"
    token: str = dataclasses.field(default="", repr=False)
    session: str = ""  # Mcp-Session-Id: set, the request is of the 2025 era
    version: str = PROTOCOL  # MCP-Protocol-Version

    def body(self) -> bytes:
        params = self.params if self.session else {**self.params, "_meta": META}
        return orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": self.method, "params": params})

    def headers(self) -> dict[str, str]:
        found = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": self.version,
        }
        if self.session:
            found["Mcp-Session-Id"] = self.session
        else:
            found["Mcp-Method"] = self.method
            if self.name:
                found["Mcp-Name"] = self.name
        if self.token:
            found["Authorization"] = f"Bearer {self.token}"
        return found

    def env(self) -> dict[str, str]:
        """The environment bench/wrk/mcp.lua builds the request from."""
        found = {
            "BENCH_BODY": self.body().decode(),
            "BENCH_METHOD": self.method,
            "BENCH_NAME": self.name,
            "BENCH_EXPECT": self.expect,
            "BENCH_TOKEN": self.token,
        }
        if self.session:  # only then: a modern run's recorded environment stays as it was
            found |= {"BENCH_SESSION": self.session, "BENCH_VERSION": self.version}
        return found

    def shown_headers(self) -> dict[str, str]:
        """headers() as recorded: the token replaced by a placeholder."""
        found = self.headers()
        if self.token:
            found["Authorization"] = "Bearer <token>"
        return found

    def without_token(self) -> Request:
        return dataclasses.replace(self, token="")

    def shown_env(self) -> dict[str, str]:
        """env() as recorded: the token replaced by a placeholder."""
        return {k: ("<token>" if k == "BENCH_TOKEN" and v else v) for k, v in self.env().items()}


def post(url: str, request: Request, timeout_s: float = 10.0) -> tuple[int, bytes]:
    """Send `request` once: the answer's status and body."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout_s)
    try:
        connection.request("POST", parts.path or "/", request.body(), request.headers())
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def check(url: str, request: Request, label: str) -> tuple[dict[str, Any], bytes]:
    """Send `request` once; its answer must be 200 with a JSON-RPC result holding
    `request.expect`, else SystemExit: a misconfiguration must not be measured as speed."""
    try:
        status, raw = post(url, request)
    except OSError as exc:
        raise SystemExit(f"{label}: {request.method} to {url} failed: {exc}") from None
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        answer = None
    if (
        status != 200
        or not isinstance(answer, dict)
        or "result" not in answer
        or request.expect.encode() not in raw
    ):
        shown = raw[:500].decode(errors="replace")
        raise SystemExit(f"{label}: {request.method} to {url} answered {status}: {shown}")
    return answer, raw


# --- wrk ----------------------------------------------------------------------------------

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS[unit]


def parse_wrk(output: str) -> dict[str, Any]:
    def find(pattern: str) -> re.Match[str]:
        match = re.search(pattern, output, re.MULTILINE)
        if match is None:
            raise SystemExit(f"wrk output lacks {pattern!r}:\n{output}")
        return match

    requests = find(r"^\s*(\d+) requests in ")
    socket_errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    checked = find(r"^taskgate-bench good=(\d+) bad=(\d+)")
    mean, _stdev, most = find(r"^\s+Latency\s+(\S+)\s+(\S+)\s+(\S+)").groups()
    return {
        "requests": int(requests.group(1)),
        "requests_per_s": float(find(r"^Requests/sec:\s+([\d.]+)").group(1)),
        "mean_ms": round(_ms(mean), 3),
        "max_ms": round(_ms(most), 3),
        "p50_ms": round(_ms(find(r"^\s+50%\s+(\S+)").group(1)), 3),
        "p99_ms": round(_ms(find(r"^\s+99%\s+(\S+)").group(1)), 3),
        "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": [int(n) for n in socket_errors.groups()] if socket_errors else [0] * 4,
        "checked_good": int(checked.group(1)),
        "checked_bad": int(checked.group(2)),
    }


def wrk_argv(url: str, *, threads: int, connections: int, seconds: float) -> list[str]:
    argv = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--latency"]
    return [*argv, f"--timeout={WRK_TIMEOUT_S}s", "-s", str(LUA), url]


def wrk(
    url: str, request: Request, *, threads: int, connections: int, seconds: float
) -> tuple[list[str], str]:
    """wrk's argv and its output, after it exited 0 (else SystemExit)."""
    argv = wrk_argv(url, threads=threads, connections=connections, seconds=seconds)
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=seconds + 30,
        check=False,
        cwd=procs.ROOT,
        # An era setting inherited from the caller's environment must not change the request.
        env={**os.environ, "BENCH_SESSION": "", "BENCH_VERSION": "", **request.env()},
    )
    if done.returncode != 0:
        raise SystemExit(f"wrk exited with {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return argv, done.stdout


# --- CPU ----------------------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_cpu_s() -> float:
    """CPU time spent by the whole machine (all CPUs, every process), from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(n) for n in stat.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """CPU time of this process's children that have exited and been waited for (wrk)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tree(pid: int) -> list[int]:
    """`pid` and its living descendants (nginx's workers, taskgate's), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # it exited meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(parents.get(current, []))
    return found


def _cpu_of(pids: list[int]) -> dict[int, float]:
    found = {}
    for pid in pids:
        with contextlib.suppress(OSError):  # it exited meanwhile
            found[pid] = cpu_s(pid)
    return found


def drive(
    label: str,
    url: str,
    request: Request,
    pids: dict[str, int],
    *,
    seconds: float,
    connections: int,
    threads: int,
    warmup_s: float = 1,
) -> dict[str, Any]:
    """A warm-up, then the measured wrk run; every response is checked (SystemExit if any is
    not the expected answer). `pids` names the processes (with their descendants) whose CPU
    time per request is reported."""
    if warmup_s > 0:
        wrk(url, request, threads=threads, connections=connections, seconds=warmup_s)
    trees = {name: tree(pid) for name, pid in pids.items()}
    before = {name: _cpu_of(members) for name, members in trees.items()}
    wrk_before, busy_before, ours_before = children_cpu_s(), busy_cpu_s(), cpu_s(os.getpid())
    started = time.monotonic()
    argv, output = wrk(url, request, threads=threads, connections=connections, seconds=seconds)
    elapsed = time.monotonic() - started
    cpu: dict[str, float] = {}
    for name, members in trees.items():
        after = _cpu_of(members)
        cpu[name] = sum(after[pid] - before[name][pid] for pid in after if pid in before[name])
    cpu["wrk"] = children_cpu_s() - wrk_before
    # What else ran meanwhile (other users of a shared machine): all busy CPU time minus ours.
    busy = busy_cpu_s() - busy_before
    others = busy - sum(cpu.values()) - (cpu_s(os.getpid()) - ours_before)
    found = parse_wrk(output)
    bad = found["non_2xx"] or found["checked_bad"] or any(found["socket_errors"])
    if bad or found["checked_good"] != found["requests"] or found["requests"] == 0:
        raise SystemExit(f"{label}: wrk saw failures, not measuring them as speed:\n{output}")
    found["cpu_us_per_request"] = {
        name: round(seconds_used * 1e6 / found["requests"], 1) for name, seconds_used in cpu.items()
    }
    # Little's law with one request in flight per connection; wrk's own mean is higher when
    # it adds coordinated-omission samples for stalls (it does, for any response slower than
    # twice the mean interval).
    found["mean_ms_implied"] = round(connections * 1000 / found["requests_per_s"], 3)
    found["cpu_share"] = {  # of the whole machine: 1.0 is every CPU busy for the whole run
        "all": round(busy / (elapsed * CPUS), 3),
        "other_processes": round(max(0.0, others) / (elapsed * CPUS), 3),
    }
    found["command"] = argv
    found["environment"] = request.shown_env()
    found["processes"] = {name: members for name, members in trees.items()}
    found["wrk_output"] = output
    return found


# --- what was measured --------------------------------------------------------------------


def _version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=10)
    except OSError as exc:
        return f"unavailable: {exc}"
    lines = (done.stdout + done.stderr).splitlines()
    return lines[0].strip() if lines else "unknown"


def machine(**tools: list[str]) -> dict[str, Any]:
    """The machine and the versions measured; `tools` name more version commands to run."""
    model = ""
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    found: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "sched_affinity": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "loadavg_at_start": os.getloadavg(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "aiohttp": aiohttp.__version__,
        "wrk": _version(["wrk", "-v"]),
    }
    found.update({name: _version(argv) for name, argv in tools.items()})
    return found


def source(*paths: str) -> dict[str, Any]:
    """Which taskgate was measured: the commit, and files under `paths` that differ from it."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], capture_output=True, text=True, check=False, cwd=procs.ROOT
        )
        return done.stdout.strip() if done.returncode == 0 else "unknown (not a git checkout?)"

    found: dict[str, Any] = {"root": str(procs.ROOT), "commit": git("rev-parse", "HEAD")}
    for path in paths:
        status = git("status", "--porcelain", "--", path)
        found[f"{path}_changes_not_committed"] = status.splitlines()
    return found


def argv_of(proc: subprocess.Popen[bytes]) -> list[str]:
    return [str(arg) for arg in cast(list[Any], proc.args)]
