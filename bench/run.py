"""taskgate against the backend direct, nginx and a bare aiohttp forwarder, under wrk, in one run.

    python -m bench.run [--seconds 5] [--connections 1,16,64] [--workers N]
                        [--builds compiled,pure] [--access-log] [--limits] [--json out.json]

Starts on loopback, each as a process of its own, and stops them all by pid at the end (also on
a failure, Ctrl-C, SIGTERM or the run's time limit):

- the instant backend (bench/instant_backend.py): tools/call `echo` answers a ~300-byte result,
  `make_task` creates a task, tasks/get answers any task it created;
- redis-server, `--save '' --appendonly no`, in a temp dir;
- taskgate (`python -m gateway run`), one process per build measured, each with the same
  settings but its own port, with every check on: ES256 JWT auth (the public key in a PEM
  file), the Redis store, route `*` to the backend. They share the backend and redis (a task
  recorded through one is found through the other, as between two instances). The token lives
  an hour and is the same in every request, so each taskgate's verified-token cache (on by
  default) serves it, as it would for a real client that reuses its token. The builds
  (--builds) are `compiled` (the hot modules compiled with mypyc, their extensions beside the
  .py files; TASKGATE_PURE taken out of its environment) and `pure` (TASKGATE_PURE=1 in its
  environment: the .py files although the extensions exist); by default both when
  gateway/h1/server*.so exists, else `pure` alone. Before anything starts, `python -m gateway
  --version` run with each one's environment must name its build; once it listens, its
  /proc/<pid>/maps (with its workers') must hold gateway/h1/server's extension (compiled) or
  no compiled file of taskgate at all (pure). Otherwise the run stops;
- nginx (Debian's) as the reference reverse proxy: a config in the temp dir, master in the
  foreground with `worker_processes 1`, `upstream` with `keepalive 64`, `proxy_http_version
  1.1`, `proxy_set_header Connection ""`, proxy buffering on (nginx's default, what a proxy of
  small JSON answers uses), client and upstream keepalive_requests raised so that nginx does
  not close a connection every 1000 requests (aiohttp never does), access log off;
- the bare forwarder (bench/bare_forwarder.py): one aiohttp ClientSession, no checks.

With --workers N, each taskgate gets `--workers N` (if its `run` has that flag; else it runs
one process and this says so), and nginx and the bare forwarder get N processes too, so that
the proxies compare like for like; the backend stays one process.

A task is created through the first taskgate (tools/call make_task, with the token) and every
target is checked with one tools/call echo and one tasks/get of that task (200 and a JSON-RPC
result; and each taskgate answers 401 without the token). Then wrk (Debian's,
bench/wrk/mcp.lua, which checks every response) drives each target with the same request,
token included: for tools/call echo and for tasks/get, at each connection count, the targets
interleaved per (method, connections) cell (direct, nginx, bare, taskgate, taskgate-pure: the
compiled build's and the pure build's, those measured), each run after an unrecorded 1 s
warm-up. Any non-2xx, socket error or unexpected body stops the run. CPU time per request of
every process it started (each taskgate's with its workers) is read from /proc around each
run, and the machine's busy CPU time not theirs is what other processes used meanwhile (marked
"!" above 10% of the machine). Reported for each build: its req/s over direct's, nginx's and
the bare forwarder's, its p50 minus direct's, and with both builds the compiled build's req/s
and own CPU per request over the pure build's.
"""

from __future__ import annotations

import argparse
import contextlib
import grp
import json
import math
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
REFERENCES = ("direct", "nginx", "bare")  # what each taskgate build is compared with
TASKGATE = {"compiled": "taskgate", "pure": "taskgate-pure"}  # each build's target
LABELS = {
    "direct": "direct",
    "nginx": "nginx",
    "bare": "bare forwarder",
    "taskgate": "taskgate (compiled)",
    "taskgate-pure": "taskgate (pure)",
}
WARMUP_S = 1
WRK_THREADS = 2  # at most; never more than the connections
TOKEN_LIFETIME_S = 3600  # far longer than a run: the verified-token cache is in play
RUN_OVERHEAD_S = 1.5  # per wrk pair: start, connect, report (for the time limit)
STARTUP_ALLOWANCE_S = 150  # processes to start and stop, checks (for the time limit)
BUILD_ALLOWANCE_S = 30  # per build: its --version check, its process to start (time limit)


# --- what runs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    build: str | None = None  # a taskgate's: "compiled" or "pure"


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


# --limits: every request pays the rate and task-quota check (one Redis script each), with
# figures far above what the run sends, so that nothing is refused.
LIMITS = {
    "tenant": {"rate_per_s": 1_000_000, "burst": 1_000_000, "live_tasks": 10_000_000},
    "principal": {"rate_per_s": 1_000_000, "burst": 1_000_000},
}


def es256_auth(work: Path) -> tuple[dict[str, Any], SigningKey]:
    """taskgate's `auth` settings for an ES256 key made for this run (its public half written
    to work/es256.pem), and the key, which signs the run's tokens."""
    signer = SigningKey("ES256", new_key("ES256"))
    pem = work / "es256.pem"
    public = signer.private.public_key()
    pem.write_bytes(public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    key = {"kid": signer.kid, "alg": "ES256", "file": str(pem)}
    auth = {"mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "algorithms": ["ES256"]}
    return {**auth, "keys": [key]}, signer


def taskgate_config(
    work: Path,
    port: int,
    redis_port: int,
    backend: str,
    access_log: bool = False,
    limits: bool = False,
) -> tuple[dict[str, Any], str]:
    """taskgate's settings (with the public key written to a PEM file) and a token for it."""
    auth, signer = es256_auth(work)
    settings = {
        "listen": {"host": "127.0.0.1", "port": port},
        "store": {"url": f"redis://127.0.0.1:{redis_port}/0"},
        "auth": auth,
        "backends": {"instant": {"replicas": [backend]}},
        "routes": [{"tools": ["*"], "backend": "instant"}],
    }
    if taskgate_has_request_logs():  # taskgate before issue 14 has no such key
        settings["logging"] = {"access": access_log}
    if limits:
        settings["limits"] = LIMITS
    return settings, Issuer(keys=[signer]).token(lifetime_s=TOKEN_LIFETIME_S)


@dataclass
class Started:
    targets: dict[str, Target]
    redis: subprocess.Popen[bytes]
    token: str
    processes: int
    workers_flag: bool
    setup: dict[str, Any]
    builds: dict[str, dict[str, Any]]  # per taskgate target: its build, as checked

    @property
    def taskgates(self) -> list[str]:
        """The taskgate targets, the compiled build's first."""
        return [name for name, target in self.targets.items() if target.build is not None]


# --pin: the load side (wrk, which this process starts, the backend and redis) on the first CPU,
# each proxy on the second, so that what a proxy costs is not what it loses to the load.
LOAD_CPU, PROXY_CPU = 0, 1


def pin(pid: int, cpu: int) -> None:
    """Every thread of `pid` and of its descendants on `cpu` (threads started later inherit
    it from the thread that starts them)."""
    for member in load.tree(pid):
        with contextlib.suppress(OSError):  # it exited meanwhile
            for thread in os.listdir(f"/proc/{member}/task"):
                os.sched_setaffinity(int(thread), {cpu})


@contextlib.contextmanager
def started(
    work: Path,
    workers: int | None,
    builds: list[str],
    access_log: bool = False,
    limits: bool = False,
    pinned: bool = False,
) -> Iterator[Started]:
    """Everything on loopback, in `work`, a taskgate per build in `builds`; all of it stopped
    by pid when the block ends. `pinned`: on CPUs apart (LOAD_CPU, PROXY_CPU)."""
    taskgates = {build: TASKGATE[build] for build in builds}
    names = ("backend", "redis", "nginx", "bare", *taskgates.values())
    ports = dict(zip(names, procs.free_ports(len(names)), strict=True))
    direct = f"http://127.0.0.1:{ports['backend']}/mcp"
    workers_flag = taskgate_has_workers()
    processes = workers if workers is not None and workers_flag else 1
    # Before anything starts: a build that would run under the other's name stops the run here.
    envs = {build: procs.build_env(build) for build in builds}
    versions = {build: procs.build_version(build, envs[build]) for build in builds}
    (work / "redis").mkdir()
    nginx_dir = work / "nginx"
    nginx_dir.mkdir()
    if os.geteuid() == 0:
        work.chmod(0o711)  # nginx's workers (user nobody) reach their temp paths
    with contextlib.ExitStack() as stack:
        backend = stack.enter_context(procs.instant_backend(ports["backend"]))
        redis = stack.enter_context(procs.redis(ports["redis"], work / "redis"))

        first = next(iter(taskgates.values()))
        settings, token = taskgate_config(
            work, ports[first], ports["redis"], direct, access_log, limits
        )
        gateways: dict[str, subprocess.Popen[bytes]] = {}
        configs: dict[str, dict[str, Any]] = {}
        checked: dict[str, dict[str, Any]] = {}
        for build, name in taskgates.items():
            # Every build runs the same settings; only the port differs.
            configs[name] = {**settings, "listen": {**settings["listen"], "port": ports[name]}}
            config_path = work / f"{name}.yaml"
            # JSON is YAML: the file holds exactly the settings recorded.
            config_path.write_text(json.dumps(configs[name], indent=2) + "\n")
            argv = [sys.executable, "-m", "gateway", "run", "--config", str(config_path)]
            argv += ["--log-level", "warning"]
            if workers is not None and workers_flag:
                argv += ["--workers", str(workers)]
            gateways[name] = stack.enter_context(procs.started(argv, ports[name], envs[build]))
            # The --version check saw the environment; this sees the process that serves.
            files = procs.compiled_files_mapped(load.tree(gateways[name].pid))
            procs.check_running_build(build, files)
            checked[name] = {
                "build": build,
                "version": versions[build],
                "environment": {"TASKGATE_PURE": envs[build].get("TASKGATE_PURE")},
                "compiled_files_mapped": len(files),
            }

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
        }
        for build, name in taskgates.items():
            url = f"http://127.0.0.1:{ports[name]}/mcp"
            targets[name] = Target(name, url, gateways[name], build)
        everything = {"backend": backend, "redis": redis, **gateways}
        everything |= {"nginx": nginx, "bare": bare}
        if pinned:
            for name, proc in everything.items():
                pin(proc.pid, LOAD_CPU if name in ("backend", "redis") else PROXY_CPU)
            os.sched_setaffinity(0, {LOAD_CPU})  # this process, and the wrk runs it starts
        setup = {
            "ports": ports,
            "commands": {name: load.argv_of(proc) for name, proc in everything.items()},
            "taskgate_configs": configs,
            "nginx_config": conf,
        }
        try:
            yield Started(targets, redis, token, processes, workers_flag, setup, checked)
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
    """One request of each method to every target; each taskgate also refuses it without a
    token."""
    sizes: dict[str, Any] = {}
    for name, target in run.targets.items():
        for method, request in requests.items():
            _, raw = load.check(target.url, request, LABELS[name])
            sizes.setdefault(name, {})[method] = len(raw)
    refused = requests["tasks/get"].without_token()
    statuses: dict[str, int] = {}
    for name in run.taskgates:
        status, raw = load.post(run.targets[name].url, refused)
        if status != 401:
            raise SystemExit(
                f"{LABELS[name]} answered a tasks/get without a token with {status}: {raw!r}"
            )
        statuses[name] = status
    return {"response_bytes": sizes, "taskgate_without_token": statuses}


def matrix(
    run: Started, requests: dict[str, load.Request], connections: list[int], seconds: int
) -> dict[str, Any]:
    pids = {name: target.proc.pid for name, target in run.targets.items()}
    pids = {"backend": pids.pop("direct"), **pids, "redis": run.redis.pid}
    names, taskgates = list(run.targets), run.taskgates
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
            for name in taskgates:
                cell[name]["build"] = run.targets[name].build
                cell[name]["version"] = run.builds[name]["version"]
            cell["taskgate_ratio"] = {
                name: {
                    ref: round(cell[name]["requests_per_s"] / cell[ref]["requests_per_s"], 3)
                    for ref in REFERENCES
                }
                for name in taskgates
            }
            cell["taskgate_p50_added_ms"] = {
                name: round(cell[name]["p50_ms"] - cell["direct"]["p50_ms"], 3)
                for name in taskgates
            }
            both = builds_compared(cell)
            if both is not None:
                cell["compiled_over_pure"] = both
            results[method][str(count)] = cell
            done += 1
            shown = ", ".join(f"{name} {cell[name]['requests_per_s']:.0f}/s" for name in names)
            if both is not None:
                shown += f"; compiled/pure {both['requests_per_s']:.2f}x"
            others = max(cell[name]["cpu_share"]["other_processes"] for name in names)
            print(
                f"  [{done}/{cells}] {method}, {plural(count, 'connection')}: {shown}; "
                f"others {others:.0%}{' !' if others > load.NOISY else ''}",
                flush=True,
            )
    return results


def builds_compared(cell: dict[str, Any]) -> dict[str, float | None] | None:
    """The compiled build's req/s and own CPU µs per request over the pure build's, when the
    cell has both."""
    compiled, pure = cell.get(TASKGATE["compiled"]), cell.get(TASKGATE["pure"])
    if compiled is None or pure is None:
        return None
    compiled_cpu = compiled["cpu_us_per_request"][TASKGATE["compiled"]]
    pure_cpu = pure["cpu_us_per_request"][TASKGATE["pure"]]
    return {
        "requests_per_s": round(compiled["requests_per_s"] / pure["requests_per_s"], 3),
        # /proc counts clock ticks: a run too short to count one has no ratio.
        "cpu_us_per_request": round(compiled_cpu / pure_cpu, 3) if pure_cpu else None,
    }


def target_names(results: dict[str, Any]) -> list[str]:
    """The targets measured, in their order, from any cell of `results`."""
    cell = next(iter(next(iter(results.values())).values()))
    return [name for name in LABELS if name in cell]


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}{'es' if noun[-1] == 's' else 's'}"


# --- targets and report -------------------------------------------------------------------


# Issue 29's goal: each build's own CPU per request at most this many times nginx's.
CPU_GOAL = {"compiled": 1.5, "pure": 3.0}


def cpu_over_nginx(cell: dict[str, Any], taskgate: str) -> float:
    """A taskgate build's own CPU per request over nginx's, in the same run."""
    own: float = cell[taskgate]["cpu_us_per_request"][taskgate]
    nginx: float = cell["nginx"]["cpu_us_per_request"]["nginx"]
    return round(own / nginx, 2) if nginx else math.inf


def headline(results: dict[str, Any], builds: list[str]) -> list[dict[str, Any]]:
    """The figure that carries to a machine of taskgate's own: each build's CPU per request
    over nginx's (which checks nothing), per method and connection count, beside req/s and
    p50; the first lines of the summary."""
    found = []
    for build in builds:
        taskgate = TASKGATE[build]
        for method, cells in results.items():
            for count, cell in cells.items():
                run, nginx = cell[taskgate], cell["nginx"]
                found.append({
                    "build": build, "method": method, "connections": int(count),
                    "cpu_over_nginx": cpu_over_nginx(cell, taskgate),
                    "cpu_us": run["cpu_us_per_request"][taskgate],
                    "nginx_cpu_us": nginx["cpu_us_per_request"]["nginx"],
                    "requests_per_s": run["requests_per_s"],
                    "requests_over_nginx": cell["taskgate_ratio"][taskgate]["nginx"],
                    "p50_ms": run["p50_ms"],
                    "goal": CPU_GOAL[build],
                })  # fmt: skip
    return found


def print_headline(found: list[dict[str, Any]]) -> None:
    goal = ", ".join(f"{build} at most {times:g}x" for build, times in CPU_GOAL.items())
    print(f"\nHeadline: taskgate's own CPU per request over nginx's, in this run (goal: {goal})")
    for row in found:
        print(
            f"  {row['build']:<9}{row['method']:<11}{row['connections']:>3} conns: CPU "
            f"{row['cpu_over_nginx']:.2f}x nginx's ({row['cpu_us']:.1f} against "
            f"{row['nginx_cpu_us']:.1f} us); {row['requests_per_s']:,.0f} req/s, "
            f"{row['requests_over_nginx']:.2f}x nginx's; p50 {row['p50_ms']:.2f} ms"
        )


def goals(results: dict[str, Any], builds: list[str]) -> list[dict[str, Any]]:
    """The targets of the issues, each met or not, per build (information, never an exit
    status): the earlier targets for the build that ships (the compiled one when measured, else
    the pure one), the nginx target for every build measured."""
    found: list[dict[str, Any]] = []

    def add(
        build: str,
        name: str,
        method: str,
        count: int,
        value: Callable[[dict[str, Any], str], float],
        limit: float,
        above: bool,
    ) -> None:
        taskgate = TASKGATE[build]
        cell = results.get(method, {}).get(str(count))
        if cell is None:
            found.append(
                {"target": name, "build": build, "value": None, "limit": limit, "met": None}
            )
            return
        measured = value(cell, taskgate)
        met = measured >= limit if above else measured <= limit
        others = max(cell[t]["cpu_share"]["other_processes"] for t in target_names(results))
        found.append(
            {
                "target": name,
                "build": build,
                "taskgate": taskgate,
                "value": measured,
                "limit": limit,
                "met": met,
                "other_processes": others,
            }
        )

    ships = builds[0]  # the builds come in procs.BUILDS' order: compiled first when measured
    for build in builds:
        if build == ships:
            add(
                build,
                "tasks/get, 16 connections: taskgate req/s >= 0.9x the bare forwarder",
                "tasks/get",
                16,
                lambda cell, taskgate: cell["taskgate_ratio"][taskgate]["bare"],
                0.9,
                True,
            )
            add(
                build,
                "tasks/get, 16 connections: taskgate req/s >= 0.5x direct",
                "tasks/get",
                16,
                lambda cell, taskgate: cell["taskgate_ratio"][taskgate]["direct"],
                0.5,
                True,
            )
            for method in METHODS:
                add(
                    build,
                    f"{method}, 1 connection: p50 added (taskgate p50 - direct p50) <= 0.6 ms",
                    method,
                    1,
                    lambda cell, taskgate: cell["taskgate_p50_added_ms"][taskgate],
                    0.6,
                    False,
                )
        add(
            build,
            "tasks/get, 16 connections: taskgate req/s >= 0.9x nginx",
            "tasks/get",
            16,
            lambda cell, taskgate: cell["taskgate_ratio"][taskgate]["nginx"],
            0.9,
            True,
        )
        for method in METHODS:
            add(
                build,
                f"{method}, 16 connections: taskgate CPU per request <= "
                f"{CPU_GOAL[build]:g}x nginx's",
                method,
                16,
                cpu_over_nginx,
                CPU_GOAL[build],
                False,
            )
    return found


def print_tables(results: dict[str, Any], seconds: int) -> None:
    names = target_names(results)
    taskgates = [name for name in names if name not in REFERENCES]
    both = all(name in taskgates for name in TASKGATE.values())
    group = f"{'req/s':>7}{'p50':>7}{'p99':>7}"
    for method, cells in results.items():
        what = "tools/call echo" if method == "tools/call" else "tasks/get of a recorded task"
        print(
            f"\n{what}: req/s, p50 and p99 in ms (wrk --latency), {seconds} s per run after a "
            f"{WARMUP_S} s warm-up"
        )
        heads = "".join(f"{LABELS[name]:^21} |" for name in names)
        print(f"{'':>5} |{heads}")
        print(f"{'conns':>5} |{f'{group} |' * len(names)}{'others':>7}")
        for count, cell in cells.items():
            row = f"{count:>5} |"
            for name in names:
                run = cell[name]
                row += f"{run['requests_per_s']:>7.0f}{run['p50_ms']:>7.2f}{run['p99_ms']:>7.2f} |"
            others = max(cell[name]["cpu_share"]["other_processes"] for name in names)
            row += f"{others:>7.0%}" + (" !" if others > load.NOISY else "")
            print(row)
    print(
        f"others: the largest share of the machine's CPUs used, during one of the row's "
        f"{len(names)} runs,\nby processes this run did not start ('!' above {load.NOISY:.0%})"
    )

    print(
        "\nEach taskgate build's req/s over direct's, nginx's and the bare forwarder's, and its "
        "p50 minus direct's (+p50, ms)"
        + ("\ncompiled/pure: the compiled build's req/s over the pure build's" if both else "")
    )
    block = f"{'direct':>7}{'nginx':>7}{'bare':>7}{'+p50 ms':>9} |"
    heads = "".join(f"{LABELS[name] + ' over':^30} |" for name in taskgates)
    print(f"{'':<12}{'':>6} |{heads}")
    print(
        f"{'method':<12}{'conns':>6} |{block * len(taskgates)}"
        + (f"{'compiled/pure':>14}" if both else "")
    )
    for method, cells in results.items():
        for count, cell in cells.items():
            row = f"{method:<12}{count:>6} |"
            for name in taskgates:
                ratio = cell["taskgate_ratio"][name]
                row += f"{ratio['direct']:>7.2f}{ratio['nginx']:>7.2f}{ratio['bare']:>7.2f}"
                row += f"{cell['taskgate_p50_added_ms'][name]:>+9.2f} |"
            if both:
                row += f"{cell['compiled_over_pure']['requests_per_s']:>14.2f}"
            print(row)

    print(
        "\nCPU µs per request: the backend's when driven direct; nginx's and bare's own (with "
        "their workers);\nin each taskgate build's runs: its own (with its workers), the "
        "backend's behind it, redis's and wrk's"
        + ("\ncompiled/pure: the compiled build's own over the pure build's" if both else "")
    )
    block = f"{'taskgate':>9}{'backend':>8}{'redis':>7}{'wrk':>7} |"
    heads = "".join(f"{LABELS[name]:^31} |" for name in taskgates)
    print(f"{'':<12}{'':>6}{'':>9}{'':>8}{'':>8} |{heads}")
    head = f"{'method':<12}{'conns':>6}{'backend':>9}{'nginx':>8}{'bare':>8} |"
    print(f"{head}{block * len(taskgates)}" + (f"{'compiled/pure':>14}" if both else ""))
    for method, cells in results.items():
        for count, cell in cells.items():
            row = (
                f"{method:<12}{count:>6}{cell['direct']['cpu_us_per_request']['backend']:>9.1f}"
                f"{cell['nginx']['cpu_us_per_request']['nginx']:>8.1f}"
                f"{cell['bare']['cpu_us_per_request']['bare']:>8.1f} |"
            )
            for name in taskgates:
                cpu = cell[name]["cpu_us_per_request"]
                row += f"{cpu[name]:>9.1f}{cpu['backend']:>8.1f}{cpu['redis']:>7.1f}"
                row += f"{cpu['wrk']:>7.1f} |"
            if both:
                ratio = cell["compiled_over_pure"]["cpu_us_per_request"]
                row += f"{ratio:>14.2f}" if ratio is not None else f"{'-':>14}"
            print(row)


def print_goals(found: list[dict[str, Any]]) -> None:
    print("\nTargets (information only, not the exit status), per build:")
    for goal in found:
        what = f"[{goal['build']}] {goal['target']}"
        if goal["met"] is None:
            print(f"  {'not measured':<13}{what}")
            continue
        unit = " ms" if "ms" in goal["target"] else "x"
        marker = "met" if goal["met"] else "NOT MET"
        noisy = goal["other_processes"] > load.NOISY
        note = f"  (! other processes used {goal['other_processes']:.0%})" if noisy else ""
        print(f"  {marker:<13}{what}: {goal['value']:.2f}{unit}{note}")


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
        f"bare forwarder ({plural(n, 'process')}),\na taskgate per build ({plural(n, 'process')} "
        f"each: {how}; ES256 JWT, Redis store, verified-token cache on):"
    )
    for name in run.taskgates:
        checked = run.builds[name]
        pure = checked["environment"]["TASKGATE_PURE"]
        env = f"TASKGATE_PURE={pure}" if pure is not None else "TASKGATE_PURE unset"
        files = checked["compiled_files_mapped"]
        mapped = f"{plural(files, 'compiled file')} mapped" if files else "no compiled file mapped"
        print(f"  {LABELS[name]}: {env}; --version: {checked['version']}; {mapped}")
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
    builds: list[str] | None = None,
    limits: bool = False,
    pinned: bool = False,
) -> None:
    if pinned and len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("bench.run: --pin needs two CPUs (the load on one, the proxy on another)")
    for tool in ("wrk", "redis-server"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (Debian: apt-get install {tool})")
    nginx = nginx_binary()
    if builds is None:
        builds, chosen = default_builds()
    else:
        chosen = "--builds"
    if "compiled" in builds and not procs.compiled_present():
        raise SystemExit(
            "bench.run: the compiled build was asked, but there is no gateway/h1/server*.so "
            "(make compile builds it)"
        )
    names = [*REFERENCES, *(TASKGATE[build] for build in builds)]
    runs = len(METHODS) * len(connections) * len(names)
    limit = int(
        runs * (seconds + WARMUP_S + RUN_OVERHEAD_S)
        + STARTUP_ALLOWANCE_S
        + BUILD_ALLOWANCE_S * len(builds)
    )
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
            "order": "per method, per connection count: " + ", ".join(names),
            "token_lifetime_s": TOKEN_LIFETIME_S,
            "workers_requested": workers,
            "builds": builds,
            "builds_chosen_by": chosen,
            "time_limit_s": limit,
            "pinned": {"load_cpu": LOAD_CPU, "proxy_cpu": PROXY_CPU} if pinned else None,
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
    print(f"builds: {', '.join(builds)} ({chosen})")
    print(f"time limit {limit} s")
    with tempfile.TemporaryDirectory(prefix="taskgate-bench-run-") as tmp:
        with started(Path(tmp), workers, builds, access_log, limits, pinned) as run:
            report["settings"]["taskgate_run_has_workers"] = run.workers_flag
            report["settings"]["processes_per_proxy"] = run.processes
            report["builds"] = run.builds
            print_setup(run, workers, seconds, connections)
            print(f"measuring (method, connections; each: {', '.join(run.targets)}):")
            task_id = record_task(run.targets[run.taskgates[0]].url, run.token)
            requests = requests_for(task_id, run.token)
            report["checks"] = check_all(run, requests)
            report["requests"] = {
                method: {"body": request.body().decode(), "headers": request.shown_headers()}
                for method, request in requests.items()
            }
            report["results"] = matrix(run, requests, connections, seconds)
        report["setup"] = run.setup
    signal.alarm(0)
    report["headline"] = headline(report["results"], builds)
    print_headline(report["headline"])
    print_tables(report["results"], seconds)
    report["targets"] = goals(report["results"], builds)
    print_goals(report["targets"])
    noisy = any(
        cell[name]["cpu_share"]["other_processes"] > load.NOISY
        for cells in report["results"].values()
        for cell in cells.values()
        for name in names
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
    configured = "per tenant and principal: rate and live tasks (--limits)" if limits else "none"
    print(f"limits: {configured}")
    where = f"wrk, backend, redis on CPU {LOAD_CPU}; each proxy on CPU {PROXY_CPU} (--pin)"
    print(f"CPUs: {where if pinned else 'shared by every process (no --pin)'}")
    print(f"\nelapsed {report['elapsed_s']} s; " + (f"STILL RUNNING: {left}" if left else stopped))
    if out is not None:
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out}")


def default_builds() -> tuple[list[str], str]:
    """Both builds when this checkout holds the compiled one, else the pure one; and why."""
    if procs.compiled_present():
        return list(procs.BUILDS), "the default: gateway/h1/server*.so is present"
    return ["pure"], (
        "the default: pure alone, as there is no gateway/h1/server*.so (make compile builds it)"
    )


def build_list(text: str) -> list[str]:
    """--builds: compiled and/or pure, in procs.BUILDS' order whatever the order given."""
    asked = {part.strip() for part in text.split(",") if part.strip()}
    if not asked or not asked <= set(procs.BUILDS):
        raise argparse.ArgumentTypeError(
            f"builds are {' and/or '.join(procs.BUILDS)}, comma-separated"
        )
    return [build for build in procs.BUILDS if build in asked]


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
    parser.add_argument(
        "--builds",
        type=build_list,
        help="taskgate builds to measure, comma-separated: compiled, pure (default: both when "
        "gateway/h1/server*.so exists, else pure)",
    )
    parser.add_argument("--json", type=Path, help="write every result here")
    parser.add_argument(
        "--access-log",
        action="store_true",
        help="taskgate and nginx both write a request log (off by default, for both)",
    )
    parser.add_argument(
        "--limits",
        action="store_true",
        help="taskgate checks a rate and a live-task quota per tenant and principal on every "
        "request (never reached), to measure what limits cost",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help=f"wrk, the backend and redis on CPU {LOAD_CPU}, each proxy (with its workers) on "
        f"CPU {PROXY_CPU}",
    )
    args = parser.parse_args()
    if not 1 <= args.seconds <= 60:
        parser.error("--seconds must be 1..60 (the run is bounded)")
    if args.workers is not None and not 1 <= args.workers <= 64:
        parser.error("--workers must be 1..64")
    main(
        args.seconds,
        args.connections,
        args.workers,
        args.json,
        args.access_log,
        args.builds,
        args.limits,
        args.pin,
    )
