"""Fair shares between tenants, measured: tenant B keeps its service while tenant A floods.

    python -m bench.isolation [--seconds 10] [--pure] [--json out.json] [--pause-ms 1000]

Starts on loopback, each as a process of its own, and stops them all by pid at the end (also on
a failure, Ctrl-C, SIGTERM or the run's time limit): the instant backend
(bench/instant_backend.py), redis-server (`--save '' --appendonly no`, in a temp dir), and two
taskgates on that one Redis with the same settings (`config`, their ports apart): ES256 JWT
auth, the Redis store, route `*` to the backend, and the `limits` section (LIMITS, with
`pause_refused_ms` from --pause-ms: 0 turns the pause off). Tokens carry
the tenant claim: B is "acme", A is "globex".

Tenant B runs a paced closed loop (B_RATE_PER_S over both instances: B_WORKERS connections per
instance alternating tools/call echo and tasks/get of a task B created, one request in flight
each, and make_task every B_CREATE_EVERY_S alternately on each instance). After an unrecorded
warm-up it is measured alone for --seconds, then for --seconds more while A floods
(bench/isolation_load.py, its own process at the lowest CPU priority, SCHED_IDLE, as if on a
machine of its own; READY before that clock starts and stopped after it). B succeeds on
HTTP 200 with a JSON-RPC result; anything else is B's failure. Reported for B: requests,
success ratio, p50, p99 (from each request's send), p99 flood/alone; for A: sent, succeeded,
refused by status and by the error's data.limit; and per phase each process's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp

from bench import isolation_load as flood
from bench import isolation_report as report
from bench import load, procs
from bench.isolation_load import Sent, client, paced, summary
from bench.run import es256_auth
from tests.support.issuer import Issuer

# B's steady load, well under every one of its limits below: a sixth of rate_per_s, at most
# B_WORKERS + 1 requests in flight per instance (of `concurrent` 40), one creation a second
# (a tenth of tasks_per_minute; live tasks stay under 2 x 60 + warm-up < 200 at --seconds 60).
B_RATE_PER_S = 50.0
B_WORKERS = 2  # paced connections per instance, besides the one that creates
B_CREATE_EVERY_S = 1.0
WARMUP_S = 2.0  # B alone, unrecorded: tokens verified and cached, connections open
# A's flood (bench/isolation_load.FLOOD) is far above them: 32 connections back to back are
# thousands of requests a second (rate_per_s 300); 50 held calls per instance (concurrent 40);
# 8 creation loops (tasks_per_minute 600, live_tasks 200, both reached within a second or two).
LIMITS: dict[str, Any] = {
    "tenant_share": 0.5,  # of listen.max_in_flight (100) and the backend's (32)
    "tenant": {
        "rate_per_s": 300,
        "burst": 300,
        "concurrent": 40,
        "live_tasks": 200,
        "tasks_per_minute": 600,
    },
    "polling": {"mode": "snapshot", "tolerance": 0.5},
}
# limits.pause_refused_ms: A's connections, refused, are read again after the wait they were
# told (at most this long), as a client connected straight to taskgate would be served.
PAUSE_MS = 1000
LISTEN_MAX_IN_FLIGHT = 200
BACKEND_MAX_IN_FLIGHT = 64
TENANTS = {"B": ("acme", "b-client"), "A": ("globex", "a-client")}  # tenant, subject
TOKEN_LIFETIME_S = 3600
READY_WITHIN_S = 60.0
STOP_WITHIN_S = 30.0
POLL_S = 0.05
STARTUP_ALLOWANCE_S = 240  # processes to start and stop, checks (for the time limit)


@dataclass(frozen=True)
class Started:
    urls: list[str]
    pids: dict[str, int]
    tokens: dict[str, str]  # B's and A's
    work: Path
    env: dict[str, str] | None  # taskgate's environment (None: this one)
    configs: list[dict[str, Any]]


def config(
    port: int, redis_port: int, backend: str, auth: dict[str, Any], pause_ms: int
) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": port, "max_in_flight": LISTEN_MAX_IN_FLIGHT},
        "store": {"url": f"redis://127.0.0.1:{redis_port}/0"},
        "auth": auth,
        "backends": {"instant": {"replicas": [backend], "max_in_flight": BACKEND_MAX_IN_FLIGHT}},
        "routes": [{"tools": ["*"], "backend": "instant"}],
        "limits": {**LIMITS, "pause_refused_ms": pause_ms},
    }


def check_config(path: Path, env: dict[str, str] | None) -> None:
    """`python -m gateway check` must accept `path`, else SystemExit with its words."""
    argv = [sys.executable, "-m", "gateway", "check", "--config", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=procs.ROOT,
                          env=env, timeout=120)  # fmt: skip
    if done.returncode != 0:
        said = (done.stdout + done.stderr).strip()[-2000:]
        raise SystemExit(f"bench.isolation: taskgate refuses the configuration:\n{said}")


@contextmanager
def started(work: Path, env: dict[str, str] | None, pause_ms: int) -> Iterator[Started]:
    """The backend, Redis and two taskgates on it; all stopped by pid when the block ends."""
    ports = dict(zip(("backend", "redis", "g0", "g1"), procs.free_ports(4), strict=True))
    auth, signer = es256_auth(work)
    issuer = Issuer(keys=[signer])
    tokens = {who: issuer.token(tenant, subject, lifetime_s=TOKEN_LIFETIME_S)
              for who, (tenant, subject) in TENANTS.items()}  # fmt: skip
    backend = f"http://127.0.0.1:{ports['backend']}/mcp"
    configs = []
    for name in ("g0", "g1"):
        configs.append(config(ports[name], ports["redis"], backend, auth, pause_ms))
        (work / f"{name}.yaml").write_text(json.dumps(configs[-1], indent=2) + "\n")
    check_config(work / "g0.yaml", env)
    (work / "redis").mkdir()
    with ExitStack() as stack:
        pids = {"backend": stack.enter_context(procs.instant_backend(ports["backend"])).pid}
        pids["redis"] = stack.enter_context(procs.redis(ports["redis"], work / "redis")).pid
        for name in ("g0", "g1"):
            argv = [sys.executable, "-m", "gateway", "run", "--config", str(work / f"{name}.yaml")]
            argv += ["--log-level", "warning"]
            pids[name] = stack.enter_context(procs.started(argv, ports[name], env)).pid
        urls = [f"http://127.0.0.1:{ports[name]}/mcp" for name in ("g0", "g1")]
        yield Started(urls, pids, tokens, work, env, configs)


# --- the checks before measuring ----------------------------------------------------------


def call(tool: str, token: str, arguments: dict[str, Any] | None = None) -> load.Request:
    params = {"name": tool, "arguments": arguments or {}}
    return load.Request("tools/call", params, name=tool, token=token)


def get(task_id: str, token: str) -> load.Request:
    return load.Request("tasks/get", {"taskId": task_id}, name=task_id, token=token)


def created(url: str, token: str, label: str) -> str:
    answer, _ = load.check(url, call("make_task", token), label)
    task_id: str = answer["result"]["taskId"]
    return task_id


def checked_tasks(run: Started) -> dict[str, str]:
    """A task of B's and one of A's, each made through one instance and read through the other;
    and each tenant's echo answered by each instance (else SystemExit)."""
    tasks = {}
    for who, (made, read) in {"B": (0, 1), "A": (1, 0)}.items():
        token = run.tokens[who]
        tasks[who] = created(run.urls[made], token, f"tenant {who}'s make_task")
        load.check(run.urls[read], get(tasks[who], token), f"tenant {who}'s tasks/get")
        for url in run.urls:
            load.check(url, call("echo", token), f"tenant {who}'s echo")
    return tasks


# --- tenant B's paced load ------------------------------------------------------------------


def b_interval() -> float:
    """Seconds between one paced connection's requests: B_RATE_PER_S less the creations,
    spread over B_WORKERS connections on each of the two instances."""
    return 2 * B_WORKERS / (B_RATE_PER_S - 1 / B_CREATE_EVERY_S)


async def b_load(
    sessions: list[aiohttp.ClientSession], run: Started, task_id: str, seconds: float
) -> list[Sent]:
    token = run.tokens["B"]
    pairs = list(zip(sessions, run.urls, strict=True))
    interval, workers = b_interval(), len(pairs) * B_WORKERS
    start = asyncio.get_running_loop().time()
    out: list[Sent] = []
    jobs = []
    for index in range(workers):
        session, url = pairs[index // B_WORKERS]
        cycle = [(session, url, "echo", call("echo", token)),
                 (session, url, "tasks/get", get(task_id, token))]  # fmt: skip
        jobs.append(paced(cycle, start + interval * index / workers, interval, start + seconds,
                           out))  # fmt: skip
    making = [(s, u, "make_task", call("make_task", token)) for s, u in pairs]
    jobs.append(paced(making, start, B_CREATE_EVERY_S, start + seconds, out))
    await asyncio.gather(*jobs)
    return out


# --- a phase: B's load, each process's CPU around it ----------------------------------------


def _cpu(trees: dict[str, list[int]]) -> dict[str, float]:
    found = {}
    for name, members in trees.items():
        total = 0.0
        for pid in members:
            with suppress(OSError):  # it exited meanwhile
                total += load.cpu_s(pid)
        found[name] = total
    found["B's client"] = load.cpu_s(os.getpid())
    found["machine"] = load.busy_cpu_s()
    return found


async def phase(
    sessions: list[aiohttp.ClientSession], run: Started, task_id: str, seconds: float,
    pids: dict[str, int],
) -> dict[str, Any]:  # fmt: skip
    trees = {name: load.tree(pid) for name, pid in pids.items()}
    before, started_at = _cpu(trees), time.monotonic()
    sent = await b_load(sessions, run, task_id, seconds)
    elapsed = time.monotonic() - started_at
    after = _cpu(trees)
    used = {name: after[name] - before[name] for name in after}
    machine = used.pop("machine")
    used["others"] = max(0.0, machine - sum(used.values()))
    shares = {name: round(value / elapsed, 3) for name, value in used.items()}
    return {"b": summary(sent, elapsed), "cpu_of_one_cpu": shares}


# --- A's flood, a process of its own ---------------------------------------------------------


async def _until(done: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench.isolation: {what} within {within:g} s")
        await asyncio.sleep(POLL_S)  # polled readiness, bounded by the deadline


def _idle_priority() -> None:
    """In A's flood, before it runs: the lowest CPU priority (SCHED_IDLE), as if it ran on a
    machine of its own. An attacker's client does not take the gateway's CPU; on a machine of
    a few CPUs, a flood at equal priority would, and B's latency would then measure the
    scheduler's share between them rather than taskgate. It still sends as fast as the CPU
    the others leave lets it (its rate is in the report)."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


async def flooding(
    run: Started, task_id: str, keep: Callable[[subprocess.Popen[bytes]], None]
) -> subprocess.Popen[bytes]:
    """A's flood started, once it says READY (every kind answered)."""
    (run.work / "a.token").write_text(run.tokens["A"])
    argv = [sys.executable, "-m", "bench.isolation_load", "--urls", ",".join(run.urls)]
    # --task=ID: a task id may begin with "-" (base64url), which argparse takes for an option.
    argv += ["--token-file", str(run.work / "a.token"), f"--task={task_id}"]
    argv += ["--out", str(run.work / "flood.json")]
    log = run.work / "flood.log"
    with log.open("wb") as sink:
        # Popen returns once the child is forked; its readiness is polled below.
        proc = subprocess.Popen(  # noqa: ASYNC220
            argv, cwd=procs.ROOT, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
            preexec_fn=_idle_priority,
        )  # fmt: skip
    keep(proc)

    def ready() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"A's flood exited with {proc.returncode}:\n{log.read_text()}")
        return flood.READY in log.read_text()

    await _until(ready, READY_WITHIN_S, "A's flood was not READY")
    return proc


async def stopped(proc: subprocess.Popen[bytes], run: Started) -> dict[str, Any]:
    """A's flood stopped by pid (SIGTERM); its counts."""
    proc.send_signal(signal.SIGTERM)
    await _until(lambda: proc.poll() is not None, STOP_WITHIN_S, "A's flood did not stop")
    out = run.work / "flood.json"
    if proc.returncode != 0 or not out.exists():
        log = (run.work / "flood.log").read_text()[-4000:]
        raise SystemExit(f"A's flood exited with {proc.returncode} and no counts:\n{log}")
    found: dict[str, Any] = json.loads(out.read_text())
    return found


async def measure(
    run: Started, tasks: dict[str, str], seconds: float,
    keep: Callable[[subprocess.Popen[bytes]], None],
) -> dict[str, Any]:  # fmt: skip
    sessions = [client(B_WORKERS + 1) for _ in run.urls]
    pids = dict(run.pids)
    try:
        await b_load(sessions, run, tasks["B"], WARMUP_S)
        alone = await phase(sessions, run, tasks["B"], seconds, pids)
        proc = await flooding(run, tasks["A"], keep)
        during = await phase(sessions, run, tasks["B"], seconds, {**pids, "A's flood": proc.pid})
        a_counts = await stopped(proc, run)
    finally:
        for session in sessions:
            await session.close()
    return {"phases": {report.ALONE: alone, report.FLOODED: during}, "a": a_counts}


# --- main -------------------------------------------------------------------------------------


def _stop(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(f"bench.isolation: {signal.Signals(signum).name}; stopping what it started")


def main(seconds: int, pure: bool, out: Path | None, pause_ms: int) -> None:
    limit = int(3 * seconds + WARMUP_S + STARTUP_ALLOWANCE_S)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGALRM, _stop)
    signal.alarm(limit)
    env = procs.build_env("pure") if pure else None
    if not pure:
        procs.check_compiled_current()
    found = report.header(__doc__ or "", seconds, limit, env)
    found["settings"] |= settings()
    with tempfile.TemporaryDirectory(prefix="taskgate-bench-isolation-") as tmp, ExitStack() as own:
        with started(Path(tmp), env, pause_ms) as run:
            found["settings"]["taskgate_config"] = {
                **run.configs[0],
                "listen": {**run.configs[0]["listen"], "port": "(its own)"},
            }
            report.print_setup(found["settings"])
            tasks = checked_tasks(run)

            def keep(proc: subprocess.Popen[bytes]) -> None:
                own.callback(procs.stop, proc)

            found |= asyncio.run(measure(run, tasks, seconds, keep))
            own.close()  # A's flood, if it still runs
            ours = {pid for pid in run.pids.values() for pid in load.tree(pid)}
        found["left_running"] = [pid for pid in ours if procs.alive(pid)]
    signal.alarm(0)
    report.print_results(found)
    if out is not None:
        out.write_text(json.dumps(found, indent=2) + "\n")
        print(f"wrote {out}")


def settings() -> dict[str, Any]:
    return {
        "b": {"tenant": TENANTS["B"][0], "rate_per_s": B_RATE_PER_S, "workers_per_instance":
              B_WORKERS, "interval_s": round(b_interval(), 4), "create_every_s":
              B_CREATE_EVERY_S, "warmup_s": WARMUP_S, "timeout_s": flood.TIMEOUT_S},
        "a": {"tenant": TENANTS["A"][0], "connections": flood.FLOOD, "slow_ms": flood.SLOW_MS},
        "instances": 2,
    }  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10, help="each phase (default 10)")
    parser.add_argument("--pure", action="store_true", help="taskgate with TASKGATE_PURE=1")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument(
        "--pause-ms",
        type=int,
        default=PAUSE_MS,
        help=f"limits.pause_refused_ms of both taskgates (default {PAUSE_MS}; 0: off)",
    )
    args = parser.parse_args()
    if not 1 <= args.seconds <= 60:
        parser.error("--seconds must be 1..60 (the run is bounded)")
    if not 0 <= args.pause_ms <= 60_000:
        parser.error("--pause-ms must be 0..60000 (limits.pause_refused_ms)")
    main(args.seconds, args.pure, args.json, args.pause_ms)
