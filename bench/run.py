"""taskgate against the backend direct, nginx and a bare aiohttp forwarder, under wrk, in one run.

    python -m bench.run [--seconds 5] [--connections 1,16,64] [--workers N] [--json out.json]

Starts on loopback, each as a process of its own, and stops them all by pid at the end (also on
a failure, Ctrl-C, SIGTERM or the run's time limit):

- the instant backend (bench/instant_backend.py): tools/call `echo` answers a ~300-byte result,
  `make_task` creates a task, tasks/get answers any task it created;
- redis-server, `--save '' --appendonly no`, in a temp dir;
- taskgate (`python -m gateway run`) with every check on: ES256 JWT auth (the public key in a
  PEM file), the Redis store, route `*` to the backend. The token lives an hour and is the
  same in every request, so taskgate's verified-token cache (on by default) serves it, as it
  would for a real client that reuses its token;
- nginx (Debian's) as the reference reverse proxy: a config in the temp dir, master in the
  foreground with `worker_processes 1`, `upstream` with `keepalive 64`, `proxy_http_version
  1.1`, `proxy_set_header Connection ""`, proxy buffering on (nginx's default, what a proxy of
  small JSON answers uses), client and upstream keepalive_requests raised so that nginx does
  not close a connection every 1000 requests (aiohttp never does), access log off;
- the bare forwarder (bench/bare_forwarder.py): one aiohttp ClientSession, no checks.

With --workers N, taskgate gets `--workers N` (if its `run` has that flag; else it runs one
process and this says so), and nginx and the bare forwarder get N processes too, so that the
three proxies compare like for like; the backend stays one process.

A task is created through taskgate (tools/call make_task, with the token) and every target is
checked with one tools/call echo and one tasks/get of that task (200 and a JSON-RPC result; and
taskgate answers 401 without the token). Then wrk (Debian's, bench/wrk/mcp.lua, which checks
every response) drives each target with the same request, token included: for tools/call echo
and for tasks/get, at each connection count, the targets interleaved per (method, connections)
cell (direct, nginx, bare, taskgate), each run after an unrecorded 1 s warm-up. Any non-2xx,
socket error or unexpected body stops the run. CPU time per request of every process it
started is read from /proc around each run, and the machine's busy CPU time not theirs is what
other processes used meanwhile (marked "!" above 10% of the machine).
"""

from __future__ import annotations

import argparse
import contextlib
import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from bench import load, procs
from tests.support.issuer import AUDIENCE, ISSUER, Issuer, SigningKey, new_key

METHODS = ("tools/call", "tasks/get")
TARGETS = ("direct", "nginx", "bare", "taskgate")
LABELS = {"direct": "direct", "nginx": "nginx", "bare": "bare forwarder", "taskgate": "taskgate"}
WARMUP_S = 1
WRK_THREADS = 2  # at most; never more than the connections
TOKEN_LIFETIME_S = 3600  # far longer than a run: the verified-token cache is in play
RUN_OVERHEAD_S = 1.5  # per wrk pair: start, connect, report (for the time limit)
STARTUP_ALLOWANCE_S = 150  # processes to start and stop, checks (for the time limit)


# --- what runs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    proc: subprocess.Popen[bytes]


def nginx_binary() -> str:
    found = shutil.which("nginx", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if found is None:
        raise SystemExit("nginx is not installed (Debian: apt-get install nginx)")
    return found


def nginx_config(
    directory: Path, port: int, upstream_port: int, processes: int, access_log: bool = False
) -> str:
    """A reverse proxy for JSON over HTTP/1.1 with keep-alive both ways; every path nginx
    writes is inside `directory`."""
    user = ""
    if os.geteuid() == 0:  # the master drops its workers' privileges, as nginx would by default
        nobody = pwd.getpwnam("nobody")
        user = f"user nobody {grp.getgrgid(nobody.pw_gid).gr_name};\n"
    # With --access-log, both proxies write one line per request, each in batches (nginx's
    # buffer and flush; taskgate's gateway/observe/access.py).
    access = (
        f"access_log {directory}/access.log combined buffer=64k flush=1s;"
        if access_log
        else "access_log off;"
    )
    return f"""# bench/run.py: nginx as the reference reverse proxy, on loopback
{user}daemon off;
worker_processes {processes};
pid {directory}/nginx.pid;
lock_file {directory}/nginx.lock;
error_log {directory}/error.log warn;

events {{
    worker_connections 1024;
}}

http {{
    {access}
    client_body_temp_path {directory}/client_body;
    proxy_temp_path {directory}/proxy;
    fastcgi_temp_path {directory}/fastcgi;
    uwsgi_temp_path {directory}/uwsgi;
    scgi_temp_path {directory}/scgi;
    # Clients keep their connections (nginx's default closes one every 1000 requests).
    keepalive_requests 1000000;

    upstream instant {{
        server 127.0.0.1:{upstream_port};
        keepalive 64;
        keepalive_requests 1000000;
    }}

    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://instant;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # nginx's default: a small JSON answer is read whole, the upstream connection
            # freed at once.
            proxy_buffering on;
        }}
    }}
}}
"""


def taskgate_has_request_logs() -> bool:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import gateway.config as c; print('logging' in c.Config.model_fields)",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=procs.ROOT,
        timeout=60,
    )
    return done.stdout.strip() == "True"


def taskgate_has_workers() -> bool:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "run", "--help"],
        capture_output=True,
        text=True,
        check=False,
        cwd=procs.ROOT,
        timeout=60,
    )
    return "--workers" in done.stdout


def taskgate_config(
    work: Path, port: int, redis_port: int, backend: str, access_log: bool = False
) -> tuple[dict[str, Any], str]:
    """taskgate's settings (with the public key written to a PEM file) and a token for it."""
    signer = SigningKey("ES256", new_key("ES256"))
    pem = work / "es256.pem"
    public = signer.private.public_key()
    pem.write_bytes(public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    settings = {
        "listen": {"host": "127.0.0.1", "port": port},
        "store": {"url": f"redis://127.0.0.1:{redis_port}/0"},
        "auth": {
            "mode": "jwt",
            "issuer": ISSUER,
            "audience": AUDIENCE,
            "algorithms": ["ES256"],
            "keys": [{"kid": signer.kid, "alg": "ES256", "file": str(pem)}],
        },
        "backends": {"instant": {"replicas": [backend]}},
        "routes": [{"tools": ["*"], "backend": "instant"}],
    }
    if taskgate_has_request_logs():  # taskgate before issue 14 has no such key
        settings["logging"] = {"access": access_log}
    return settings, Issuer(keys=[signer]).token(lifetime_s=TOKEN_LIFETIME_S)


@dataclass
class Started:
    targets: dict[str, Target]
    redis: subprocess.Popen[bytes]
    token: str
    processes: int
    workers_flag: bool
    setup: dict[str, Any]


@contextlib.contextmanager
def started(work: Path, workers: int | None, access_log: bool = False) -> Iterator[Started]:
    """Everything on loopback, in `work`; all of it stopped by pid when the block ends."""
    names = ("backend", "redis", "taskgate", "nginx", "bare")
    ports = dict(zip(names, procs.free_ports(len(names)), strict=True))
    direct = f"http://127.0.0.1:{ports['backend']}/mcp"
    workers_flag = taskgate_has_workers()
    processes = workers if workers is not None and workers_flag else 1
    (work / "redis").mkdir()
    nginx_dir = work / "nginx"
    nginx_dir.mkdir()
    if os.geteuid() == 0:
        work.chmod(0o711)  # nginx's workers (user nobody) reach their temp paths
    with contextlib.ExitStack() as stack:
        backend = stack.enter_context(procs.instant_backend(ports["backend"]))
        redis = stack.enter_context(procs.redis(ports["redis"], work / "redis"))

        settings, token = taskgate_config(
            work, ports["taskgate"], ports["redis"], direct, access_log
        )
        config_path = work / "taskgate.yaml"
        # JSON is YAML: the file holds exactly the settings recorded.
        config_path.write_text(json.dumps(settings, indent=2) + "\n")
        argv = [sys.executable, "-m", "gateway", "run", "--config", str(config_path)]
        argv += ["--log-level", "warning"]
        if workers is not None and workers_flag:
            argv += ["--workers", str(workers)]
        taskgate = stack.enter_context(procs.started(argv, ports["taskgate"]))

        conf = nginx_config(nginx_dir, ports["nginx"], ports["backend"], processes, access_log)
        conf_path = nginx_dir / "nginx.conf"
        conf_path.write_text(conf)
        nginx_argv = [nginx_binary(), "-p", f"{nginx_dir}/", "-c", str(conf_path)]
        nginx_argv += ["-e", str(nginx_dir / "error.log")]
        nginx = stack.enter_context(procs.started(nginx_argv, ports["nginx"]))

        bare_argv = [sys.executable, "-m", "bench.bare_forwarder", "--port", str(ports["bare"])]
        bare_argv += ["--upstream", direct, "--workers", str(processes)]
        bare = stack.enter_context(procs.started(bare_argv, ports["bare"]))

        targets = {
            "direct": Target("direct", direct, backend),
            "nginx": Target("nginx", f"http://127.0.0.1:{ports['nginx']}/mcp", nginx),
            "bare": Target("bare", f"http://127.0.0.1:{ports['bare']}/mcp", bare),
            "taskgate": Target("taskgate", f"http://127.0.0.1:{ports['taskgate']}/mcp", taskgate),
        }
        everything = {"backend": backend, "redis": redis, "taskgate": taskgate}
        everything |= {"nginx": nginx, "bare": bare}
        setup = {
            "ports": ports,
            "commands": {name: load.argv_of(proc) for name, proc in everything.items()},
            "taskgate_config": settings,
            "nginx_config": conf,
        }
        try:
            yield Started(targets, redis, token, processes, workers_flag, setup)
        finally:
            ours = {pid for proc in everything.values() for pid in load.tree(proc.pid)}
            setup["pids"] = sorted(ours)
            stack.close()
            with contextlib.suppress(OSError):
                setup["nginx_error_log"] = (nginx_dir / "error.log").read_text()[-4000:]
            left = [pid for pid in ours if procs.alive(pid)]
            setup["left_running"] = left
            if left:
                print(f"! processes this run started are still running: {left}", file=sys.stderr)


# --- checks and runs ----------------------------------------------------------------------


def requests_for(task_id: str, token: str) -> dict[str, load.Request]:
    echo = {"name": "echo", "arguments": {}}
    return {
        "tools/call": load.Request(
            "tools/call", echo, name="echo", expect='"structuredContent"', token=token
        ),
        "tasks/get": load.Request(
            "tasks/get", {"taskId": task_id}, name=task_id, expect=task_id, token=token
        ),
    }


def record_task(url: str, token: str) -> str:
    """A task created through taskgate at `url` (its route recorded), for tasks/get runs."""
    make = {"name": "make_task", "arguments": {}}
    request = load.Request("tools/call", make, name="make_task", expect='"taskId"', token=token)
    answer, _ = load.check(url, request, "taskgate make_task")
    task_id: str = answer["result"]["taskId"]
    return task_id


def check_all(run: Started, requests: dict[str, load.Request]) -> dict[str, Any]:
    """One request of each method to every target; taskgate also refuses it without a token."""
    sizes: dict[str, Any] = {}
    for name, target in run.targets.items():
        for method, request in requests.items():
            _, raw = load.check(target.url, request, LABELS[name])
            sizes.setdefault(name, {})[method] = len(raw)
    refused = requests["tasks/get"].without_token()
    status, raw = load.post(run.targets["taskgate"].url, refused)
    if status != 401:
        raise SystemExit(f"taskgate answered a tasks/get without a token with {status}: {raw!r}")
    return {"response_bytes": sizes, "taskgate_without_token": status}


def matrix(
    run: Started, requests: dict[str, load.Request], connections: list[int], seconds: int
) -> dict[str, Any]:
    pids = {name: target.proc.pid for name, target in run.targets.items()}
    pids = {"backend": pids.pop("direct"), **pids, "redis": run.redis.pid}
    results: dict[str, Any] = {}
    cells, done = len(METHODS) * len(connections), 0
    for method in METHODS:
        results[method] = {}
        for count in connections:
            cell: dict[str, Any] = {}
            for name, target in run.targets.items():
                cell[name] = load.drive(
                    f"{LABELS[name]}, {method}, {plural(count, 'connection')}",
                    target.url,
                    requests[method],
                    pids,
                    seconds=seconds,
                    connections=count,
                    threads=min(count, WRK_THREADS),
                    warmup_s=WARMUP_S,
                )
            taskgate = cell["taskgate"]
            cell["taskgate_ratio"] = {
                name: round(taskgate["requests_per_s"] / cell[name]["requests_per_s"], 3)
                for name in ("direct", "nginx", "bare")
            }
            cell["taskgate_p50_added_ms"] = round(taskgate["p50_ms"] - cell["direct"]["p50_ms"], 3)
            results[method][str(count)] = cell
            done += 1
            shown = ", ".join(f"{name} {cell[name]['requests_per_s']:.0f}/s" for name in TARGETS)
            others = max(cell[name]["cpu_share"]["other_processes"] for name in TARGETS)
            print(
                f"  [{done}/{cells}] {method}, {plural(count, 'connection')}: {shown}; "
                f"others {others:.0%}{' !' if others > load.NOISY else ''}",
                flush=True,
            )
    return results


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}{'es' if noun[-1] == 's' else 's'}"


# --- targets and report -------------------------------------------------------------------


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets of the issue, each met or not (information, never an exit status)."""
    found: list[dict[str, Any]] = []

    def add(
        name: str,
        method: str,
        count: int,
        value: Callable[[dict[str, Any]], float],
        limit: float,
        above: bool,
    ) -> None:
        cell = results.get(method, {}).get(str(count))
        if cell is None:
            found.append({"target": name, "value": None, "limit": limit, "met": None})
            return
        measured = value(cell)
        met = measured >= limit if above else measured <= limit
        others = max(cell[t]["cpu_share"]["other_processes"] for t in TARGETS)
        found.append(
            {
                "target": name,
                "value": measured,
                "limit": limit,
                "met": met,
                "other_processes": others,
            }
        )

    add(
        "tasks/get, 16 connections: taskgate req/s >= 0.9x the bare forwarder",
        "tasks/get",
        16,
        lambda cell: cell["taskgate_ratio"]["bare"],
        0.9,
        True,
    )
    add(
        "tasks/get, 16 connections: taskgate req/s >= 0.5x direct",
        "tasks/get",
        16,
        lambda cell: cell["taskgate_ratio"]["direct"],
        0.5,
        True,
    )
    for method in METHODS:
        add(
            f"{method}, 1 connection: p50 added (taskgate p50 - direct p50) <= 0.6 ms",
            method,
            1,
            lambda cell: cell["taskgate_p50_added_ms"],
            0.6,
            False,
        )
    return found


def print_tables(results: dict[str, Any], seconds: int) -> None:
    group = f"{'req/s':>7}{'p50':>7}{'p99':>7}"
    for method, cells in results.items():
        what = "tools/call echo" if method == "tools/call" else "tasks/get of a recorded task"
        print(
            f"\n{what}: req/s, p50 and p99 in ms (wrk --latency), {seconds} s per run after a "
            f"{WARMUP_S} s warm-up"
        )
        heads = "".join(f"{LABELS[name]:^21} |" for name in TARGETS)
        print(f"{'':>5} |{heads}{'taskgate req/s over':^21} |{'taskgate':>9} |")
        ratios = f"{'direct':>7}{'nginx':>7}{'bare':>7}"
        print(f"{'conns':>5} |{f'{group} |' * len(TARGETS)}{ratios} |{'+p50 ms':>9} |{'others':>7}")
        for count, cell in cells.items():
            row = f"{count:>5} |"
            for name in TARGETS:
                run = cell[name]
                row += f"{run['requests_per_s']:>7.0f}{run['p50_ms']:>7.2f}{run['p99_ms']:>7.2f} |"
            ratio = cell["taskgate_ratio"]
            row += f"{ratio['direct']:>7.2f}{ratio['nginx']:>7.2f}{ratio['bare']:>7.2f} |"
            row += f"{cell['taskgate_p50_added_ms']:>+9.2f} |"
            others = max(cell[name]["cpu_share"]["other_processes"] for name in TARGETS)
            row += f"{others:>7.0%}" + (" !" if others > load.NOISY else "")
            print(row)
    print(
        f"taskgate +p50: taskgate's p50 minus direct's. others: the largest share of the "
        f"machine's CPUs used, during one of\nthe row's four runs, by processes this run did not "
        f"start ('!' above {load.NOISY:.0%})"
    )
    print(
        "\nCPU µs per request: the backend's when driven direct; the proxy's own (with its "
        "workers) for nginx,\nbare and taskgate; the backend's behind taskgate; redis's and wrk's "
        "in the taskgate run"
    )
    head = f"{'method':<12}{'conns':>6}{'backend':>9}{'nginx':>8}{'bare':>8}{'taskgate':>10}"
    print(f"{head}{'backend':>9}{'redis':>7}{'wrk':>7}")
    for method, cells in results.items():
        for count, cell in cells.items():
            taskgate = cell["taskgate"]["cpu_us_per_request"]
            print(
                f"{method:<12}{count:>6}{cell['direct']['cpu_us_per_request']['backend']:>9.1f}"
                f"{cell['nginx']['cpu_us_per_request']['nginx']:>8.1f}"
                f"{cell['bare']['cpu_us_per_request']['bare']:>8.1f}"
                f"{taskgate['taskgate']:>10.1f}{taskgate['backend']:>9.1f}"
                f"{taskgate['redis']:>7.1f}{taskgate['wrk']:>7.1f}"
            )


def print_goals(found: list[dict[str, Any]]) -> None:
    print("\nTargets (information only, not the exit status):")
    for goal in found:
        if goal["met"] is None:
            print(f"  {'not measured':<13}{goal['target']}")
            continue
        unit = " ms" if "ms" in goal["target"] else "x"
        marker = "met" if goal["met"] else "NOT MET"
        noisy = goal["other_processes"] > load.NOISY
        note = f"  (! other processes used {goal['other_processes']:.0%})" if noisy else ""
        print(f"  {marker:<13}{goal['target']}: {goal['value']:.2f}{unit}{note}")


def print_setup(run: Started, workers: int | None, seconds: int, connections: list[int]) -> None:
    n = run.processes
    if workers is None:
        how = "no --workers given"
    elif not run.workers_flag:
        how = f"--workers {workers} asked, but taskgate run has no --workers: one process"
    else:
        how = f"taskgate run --workers {workers}"
    print(
        f"on loopback: instant backend (1 process), redis-server, nginx (worker_processes {n}), "
        f"bare forwarder ({plural(n, 'process')}),\ntaskgate ({plural(n, 'process')}: {how}; "
        f"ES256 JWT, Redis store, verified-token cache on)"
    )
    threads = ", ".join(f"-t{min(c, WRK_THREADS)} -c{c}" for c in connections)
    print(f"wrk {threads}; {seconds} s per run after {WARMUP_S} s warm-up; every response checked")


# --- main ---------------------------------------------------------------------------------


class OutOfTime(SystemExit):
    pass


def _stop(signum: int, _frame: FrameType | None) -> None:
    if signum == signal.SIGALRM:
        raise OutOfTime("bench.run: over its time limit; stopping everything it started")
    raise SystemExit(f"bench.run: {signal.Signals(signum).name}; stopping everything it started")


def main(
    seconds: int,
    connections: list[int],
    workers: int | None,
    out: Path | None,
    access_log: bool = False,
) -> None:
    for tool in ("wrk", "redis-server"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (Debian: apt-get install {tool})")
    nginx = nginx_binary()
    runs = len(METHODS) * len(connections) * len(TARGETS)
    limit = int(runs * (seconds + WARMUP_S + RUN_OVERHEAD_S) + STARTUP_ALLOWANCE_S)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGALRM, _stop)
    signal.alarm(limit)
    started_at = time.monotonic()
    assert __doc__ is not None
    report: dict[str, Any] = {
        "method": __doc__.strip(),
        "machine": load.machine(nginx=[nginx, "-v"], redis=["redis-server", "--version"]),
        "source": load.source("gateway", "bench"),
        "settings": {
            "seconds": seconds,
            "warmup_s": WARMUP_S,
            "connections": connections,
            "wrk_threads": f"min(connections, {WRK_THREADS})",
            "wrk_timeout_s": load.WRK_TIMEOUT_S,
            "wrk_script": str(load.LUA.relative_to(procs.ROOT)),
            "order": "per method, per connection count: " + ", ".join(TARGETS),
            "token_lifetime_s": TOKEN_LIFETIME_S,
            "workers_requested": workers,
            "time_limit_s": limit,
        },
    }
    m = report["machine"]
    print(f"bench.run: {m['nproc']} CPUs ({m['cpu_model']}), Python {m['python']}, ", end="")
    nginx_version = m["nginx"].removeprefix("nginx version: ")
    redis_version = m["redis"].split(" sha=")[0]
    wrk_version = m["wrk"].split(" [")[0]
    print(f"aiohttp {m['aiohttp']}, {nginx_version}, {redis_version}, {wrk_version}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}")
    changes = report["source"]["gateway_changes_not_committed"]
    print(f"taskgate at {report['source']['commit']}", end="")
    print(f", with uncommitted changes to gateway/: {len(changes)} file(s)" if changes else "")
    print(f"time limit {limit} s")
    with tempfile.TemporaryDirectory(prefix="taskgate-bench-run-") as tmp:
        with started(Path(tmp), workers, access_log) as run:
            report["settings"]["taskgate_run_has_workers"] = run.workers_flag
            report["settings"]["processes_per_proxy"] = run.processes
            print_setup(run, workers, seconds, connections)
            print("measuring (method, connections; each: direct, nginx, bare, taskgate):")
            task_id = record_task(run.targets["taskgate"].url, run.token)
            requests = requests_for(task_id, run.token)
            report["checks"] = check_all(run, requests)
            report["requests"] = {
                method: {"body": request.body().decode(), "headers": request.shown_headers()}
                for method, request in requests.items()
            }
            report["results"] = matrix(run, requests, connections, seconds)
        report["setup"] = run.setup
    signal.alarm(0)
    print_tables(report["results"], seconds)
    report["targets"] = goals(report["results"])
    print_goals(report["targets"])
    noisy = any(
        cell[name]["cpu_share"]["other_processes"] > load.NOISY
        for cells in report["results"].values()
        for cell in cells.values()
        for name in TARGETS
    )
    if noisy:
        print(
            f"! other processes used more than {load.NOISY:.0%} of the machine during some runs "
            "(others, the largest share in a row): their req/s and latencies say more about that "
            "load than about the proxies; CPU µs per request moves much less."
        )
    report["elapsed_s"] = round(time.monotonic() - started_at, 1)
    left = report["setup"]["left_running"]
    stopped = f"stopped all {len(report['setup']['pids'])} processes it started"
    logs = "on, for taskgate and nginx" if access_log else "off, for taskgate and nginx"
    print(f"\nrequest logs: {logs} (--access-log)")
    print(f"\nelapsed {report['elapsed_s']} s; " + (f"STILL RUNNING: {left}" if left else stopped))
    if out is not None:
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out}")


def connection_counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",") if part.strip()]
    if not counts or any(not 1 <= count <= 1000 for count in counts):
        raise argparse.ArgumentTypeError("connection counts are 1..1000, comma-separated")
    return counts


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5, help="measured wrk run (default 5)")
    parser.add_argument(
        "--connections",
        type=connection_counts,
        default=[1, 16, 64],
        help="wrk connection counts, comma-separated (default 1,16,64)",
    )
    parser.add_argument("--workers", type=int, help="taskgate run --workers N, if it has it")
    parser.add_argument("--json", type=Path, help="write every result here")
    parser.add_argument(
        "--access-log",
        action="store_true",
        help="taskgate and nginx both write a request log (off by default, for both)",
    )
    args = parser.parse_args()
    if not 1 <= args.seconds <= 60:
        parser.error("--seconds must be 1..60 (the run is bounded)")
    if args.workers is not None and not 1 <= args.workers <= 64:
        parser.error("--workers must be 1..64")
    main(args.seconds, args.connections, args.workers, args.json, args.access_log)
