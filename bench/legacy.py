"""taskgate's 2025-era front door against the backend direct, under wrk: tools/call on a session;
with `--client 2026`, a 2026-07-28 client's tools/call through taskgate to a backend spoken to
in the 2025 era (gateway/bridge), against the same call made by a 2025-era client directly.

    python -m bench.legacy [--seconds 5] [--connections 16] [--repeat 2] [--build compiled|pure]
                           [--client 2025|2026] [--json out.json]

With `--client 2026` the backend is configured `era: "2025"`, so taskgate speaks only the 2025
era to it, as it does to a server that speaks nothing newer: the one through taskgate is a
2026-07-28 request (params._meta, Mcp-Method, Mcp-Name, no session), which taskgate sends in a
session of its own for the caller (opened by the first call, before anything is measured) and
whose answer it gives in the 2026 shape (resultType "complete", checked). The direct one is the
2025-era call on a session, as below.

Starts on loopback, each as a process of its own, and stops them all by pid at the end (also on
a failure, Ctrl-C, SIGTERM or the run's time limit):

- the instant backend (bench/instant_backend.py), which serves the 2025 era too: initialize
  opens a session (its Mcp-Session-Id remembered), every later request must name a remembered
  one (else 404), tools/call `echo` answers a ~300-byte result in the 2025 shape;
- redis-server, `--save '' --appendonly no`, in a temp dir;
- taskgate (`python -m gateway run`), the build `--build` names (by default the compiled one
  when this checkout holds it and TASKGATE_PURE is not set, else the pure one; checked with
  `--version` before it starts, as bench/run.py checks its builds), configured as bench/run.py
  configures it: ES256 JWT auth
  (the public key in a PEM file), the Redis store, route `*` to the backend, `legacy` at its
  defaults (on). The token lives an hour and is the same in every request, so taskgate's
  verified-token cache (on by default) serves it.

Two 2025-era sessions (revision 2025-11-25) are opened as a client opens them, with initialize
and then notifications/initialized (which must get 202): one on the backend direct, one
through taskgate with the token. taskgate answers initialize itself and opens its own session
on the backend only when a request needs it, so one tools/call echo through taskgate opens that
upstream session (initialize and initialized on the backend, its Mcp-Session-Id recorded in
the Redis store) before anything is measured. Then each session is checked with one tools/call
echo (200, a JSON-RPC result holding "structuredContent", and the 2025 shape: no resultType, no
_meta); taskgate must answer 401 without the token and the backend 404 on an unknown session.

wrk (Debian's, bench/wrk/mcp.lua, which checks every response) then sends tools/call echo as a
2025-era client does: a body without params._meta, Mcp-Session-Id, MCP-Protocol-Version
2025-11-25, no Mcp-Method or Mcp-Name; through taskgate also the token. So every request
through taskgate verifies the token (cached), finds the client's session in Redis (one read;
its idle expiry is written again only once a quarter of session_idle_s has passed), routes the
tool, and relays the call on the recorded upstream session. At each connection count, direct
and taskgate runs alternate, `--repeat` times (direct, taskgate, direct, taskgate, ...), each
after an unrecorded 1 s warm-up; the ratio taskgate req/s over direct req/s is given per pair
and as their mean. Any non-2xx, socket error or unexpected body stops the run. CPU time per
request of every process it started is read from /proc around each run, and the machine's busy
CPU time not theirs is what other processes used meanwhile (marked "!" above 10% of the
machine). At the end both sessions are ended with DELETE (200), and a call on either ended
session must then get 404.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import orjson

from bench import load, procs
from bench.run import connection_counts, plural, taskgate_config

VERSION = "2025-11-25"  # the newest 2025-era revision: what a current SDK v1 client asks
TARGETS = ("direct", "taskgate")
WARMUP_S = 1
WRK_THREADS = 2  # at most; never more than the connections
RUN_OVERHEAD_S = 1.5  # per wrk run: start, connect, report (for the time limit)
STARTUP_ALLOWANCE_S = 120  # processes to start and stop, checks (for the time limit)
EXPECT = '"structuredContent"'
ECHO = {"name": "echo", "arguments": {}}
CLIENT_INFO = {"name": "bench.legacy", "version": "1"}


# --- what runs ----------------------------------------------------------------------------


@dataclass
class Started:
    urls: dict[str, str]
    pids: dict[str, int]  # backend, taskgate, redis: whose CPU time is read
    token: str
    setup: dict[str, Any]


@contextlib.contextmanager
def started(work: Path, build: str, client: str) -> Iterator[Started]:
    """The backend, redis and taskgate's `build` on loopback, in `work`; all stopped by pid at
    the end. `client` 2026: taskgate speaks the 2025 era to the backend (era: "2025")."""
    env = procs.build_env(build)
    version = procs.build_version(build, env)  # before anything starts: the build is the one named
    names = ("backend", "redis", "taskgate")
    ports = dict(zip(names, procs.free_ports(len(names)), strict=True))
    direct = f"http://127.0.0.1:{ports['backend']}/mcp"
    (work / "redis").mkdir()
    with contextlib.ExitStack() as stack:
        backend = stack.enter_context(procs.instant_backend(ports["backend"]))
        redis = stack.enter_context(procs.redis(ports["redis"], work / "redis"))
        settings, token = taskgate_config(work, ports["taskgate"], ports["redis"], direct)
        if client == "2026":
            settings["backends"]["instant"]["era"] = "2025"
        config_path = work / "taskgate.yaml"
        # JSON is YAML: the file holds exactly the settings recorded.
        config_path.write_text(json.dumps(settings, indent=2) + "\n")
        argv = [sys.executable, "-m", "gateway", "run", "--config", str(config_path)]
        argv += ["--log-level", "warning"]
        taskgate = stack.enter_context(procs.started(argv, ports["taskgate"], env))
        everything = {"backend": backend, "redis": redis, "taskgate": taskgate}
        setup: dict[str, Any] = {
            "build": build,
            "taskgate_version": version,
            "ports": ports,
            "commands": {name: load.argv_of(proc) for name, proc in everything.items()},
            "taskgate_config": settings,
        }
        urls = {"direct": direct, "taskgate": f"http://127.0.0.1:{ports['taskgate']}/mcp"}
        pids = {name: proc.pid for name, proc in everything.items()}
        try:
            yield Started(urls, pids, token, setup)
        finally:
            ours = {pid for proc in everything.values() for pid in load.tree(proc.pid)}
            setup["pids"] = sorted(ours)
            stack.close()
            left = [pid for pid in ours if procs.alive(pid)]
            setup["left_running"] = left
            if left:
                print(f"! processes this run started are still running: {left}", file=sys.stderr)


# --- sessions and checks ------------------------------------------------------------------


def exchange(
    url: str, method: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, str | None, bytes]:
    """One HTTP request: the answer's status, its Mcp-Session-Id (if any) and its body."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10.0)
    try:
        connection.request(method, parts.path or "/", body, headers)
        response = connection.getresponse()
        return response.status, response.getheader("Mcp-Session-Id"), response.read()
    except OSError as exc:
        raise SystemExit(f"{method} {url} failed: {exc}") from None
    finally:
        connection.close()


def _base_headers(token: str) -> dict[str, str]:
    found = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if token:
        found["Authorization"] = f"Bearer {token}"
    return found


def open_session(url: str, token: str, label: str) -> str:
    """initialize, then notifications/initialized, as a 2025-era client opens a session; its
    Mcp-Session-Id. Anything unexpected is SystemExit."""
    params = {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO}
    body = orjson.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})
    status, session, raw = exchange(url, "POST", body, _base_headers(token))
    answer = _json(raw)
    result = answer.get("result") if isinstance(answer, dict) else None
    if status != 200 or not isinstance(result, dict) or not session:
        raise SystemExit(f"{label}: initialize answered {status} ({session=}): {raw[:500]!r}")
    if result.get("protocolVersion") != VERSION:
        raise SystemExit(f"{label}: initialize negotiated {result.get('protocolVersion')!r}")
    initialized = orjson.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
    headers = {**_base_headers(token), "Mcp-Session-Id": session, "MCP-Protocol-Version": VERSION}
    status, _, raw = exchange(url, "POST", initialized, headers)
    if status != 202:
        raise SystemExit(f"{label}: notifications/initialized answered {status}: {raw[:500]!r}")
    return session


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def echo_request(session: str, token: str) -> load.Request:
    return load.Request(
        "tools/call",
        ECHO,
        name="echo",
        expect=EXPECT,
        token=token,
        session=session,
        version=VERSION,
    )


def check_echo(url: str, request: load.Request, label: str) -> int:
    """One tools/call echo: 200, a result with the expected text, in the 2025 shape; its size."""
    answer, raw = load.check(url, request, label)
    result = answer["result"]
    if "resultType" in result or "_meta" in result:
        raise SystemExit(f"{label}: a tools/call answer not in the 2025 shape: {raw[:500]!r}")
    return len(raw)


def end_session(url: str, request: load.Request, label: str) -> None:
    """DELETE the session (200); a later call on it must get 404."""
    headers = {k: v for k, v in request.headers().items() if k != "Content-Type"}
    status, _, raw = exchange(url, "DELETE", None, headers)
    if status != 200:
        raise SystemExit(f"{label}: DELETE of the session answered {status}: {raw[:500]!r}")
    status, raw = load.post(url, request)
    if status != 404:
        raise SystemExit(f"{label}: a call on an ended session answered {status}: {raw[:500]!r}")


def modern_echo(token: str) -> load.Request:
    """tools/call echo as a 2026-07-28 client sends it (bench/run.py's request)."""
    return load.Request("tools/call", ECHO, name="echo", expect=EXPECT, token=token)


def check_modern_echo(url: str, request: load.Request, label: str) -> int:
    """One 2026-07-28 tools/call echo through the bridge: a result in the 2026 shape; its size."""
    answer, raw = load.check(url, request, label)
    if answer["result"].get("resultType") != "complete":
        raise SystemExit(f"{label}: a tools/call answer not in the 2026 shape: {raw[:500]!r}")
    return len(raw)


def prepare(run: Started, client: str) -> tuple[dict[str, load.Request], dict[str, Any]]:
    """A session on each target that has them, checked; the request wrk sends to each."""
    direct, taskgate = run.urls["direct"], run.urls["taskgate"]
    requests = {"direct": echo_request(open_session(direct, "", "direct"), "")}
    checkers = {"direct": check_echo, "taskgate": check_echo}
    if client == "2026":
        requests["taskgate"] = modern_echo(run.token)
        checkers["taskgate"] = check_modern_echo
    else:
        requests["taskgate"] = echo_request(
            open_session(taskgate, run.token, "taskgate"), run.token
        )
    # The first call through taskgate opens its upstream session: not a cost to measure.
    opening = time.monotonic()
    checkers["taskgate"](taskgate, requests["taskgate"], "taskgate (opening its upstream session)")
    opened_ms = (time.monotonic() - opening) * 1000
    sizes = {name: checkers[name](run.urls[name], r, name) for name, r in requests.items()}
    status, raw = load.post(taskgate, requests["taskgate"].without_token())
    if status != 401:
        raise SystemExit(f"taskgate answered a call without the token with {status}: {raw!r}")
    unknown = echo_request("not-a-session-of-this-backend", "")
    status, raw = load.post(direct, unknown)
    if status != 404:
        raise SystemExit(f"the backend answered an unknown session with {status}: {raw!r}")
    checks = {
        "response_bytes": sizes,
        "first_call_through_taskgate_ms": round(opened_ms, 2),
        "taskgate_without_token": 401,
        "backend_unknown_session": 404,
    }
    return requests, checks


# --- runs ---------------------------------------------------------------------------------


def measure(
    run: Started,
    requests: dict[str, load.Request],
    connections: list[int],
    seconds: int,
    repeat: int,
    what: str,
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    pairs, done = len(connections) * repeat, 0
    for count in connections:
        rounds: list[dict[str, Any]] = []
        for index in range(repeat):
            pair: dict[str, Any] = {}
            for name in TARGETS:
                pair[name] = load.drive(
                    f"{name}, {what}, {plural(count, 'connection')}",
                    run.urls[name],
                    requests[name],
                    run.pids,
                    seconds=seconds,
                    connections=count,
                    threads=min(count, WRK_THREADS),
                    warmup_s=WARMUP_S,
                )
            ratio = pair["taskgate"]["requests_per_s"] / pair["direct"]["requests_per_s"]
            pair["taskgate_ratio"] = round(ratio, 3)
            rounds.append(pair)
            done += 1
            others = max(pair[name]["cpu_share"]["other_processes"] for name in TARGETS)
            print(
                f"  [{done}/{pairs}] {plural(count, 'connection')}, repeat {index + 1}: "
                f"direct {pair['direct']['requests_per_s']:.0f}/s, "
                f"taskgate {pair['taskgate']['requests_per_s']:.0f}/s; "
                f"others {others:.0%}{' !' if others > load.NOISY else ''}",
                flush=True,
            )
        mean = sum(pair["taskgate_ratio"] for pair in rounds) / len(rounds)
        results[str(count)] = {"repeats": rounds, "taskgate_ratio_mean": round(mean, 3)}
    return results


def print_table(results: dict[str, Any], seconds: int, what: str) -> None:
    print(
        f"\ntools/call echo, {what}: {seconds} s per run after a "
        f"{WARMUP_S} s warm-up; CPU µs per request from /proc"
    )
    head = f"{'conns':>5} {'rep':>3} {'target':<9}{'req/s':>8}{'p50 ms':>8}{'p99 ms':>8}"
    print(f"{head}{'taskgate':>10}{'backend':>9}{'redis':>7}{'wrk':>7}{'others':>8}")
    for count, cell in results.items():
        for index, pair in enumerate(cell["repeats"], start=1):
            for name in TARGETS:
                run = pair[name]
                cpu = run["cpu_us_per_request"]
                others = run["cpu_share"]["other_processes"]
                print(
                    f"{count:>5} {index:>3} {name:<9}{run['requests_per_s']:>8.0f}"
                    f"{run['p50_ms']:>8.2f}{run['p99_ms']:>8.2f}{cpu['taskgate']:>10.1f}"
                    f"{cpu['backend']:>9.1f}{cpu['redis']:>7.1f}{cpu['wrk']:>7.1f}"
                    f"{others:>8.0%}" + (" !" if others > load.NOISY else "")
                )
        ratios = ", ".join(f"{pair['taskgate_ratio']:.2f}" for pair in cell["repeats"])
        print(
            f"{count:>5}     taskgate req/s over direct: {ratios} (per repeat); "
            f"mean {cell['taskgate_ratio_mean']:.2f}"
        )
    print(
        "taskgate, backend, redis, wrk: CPU µs per request of each (taskgate idles in a direct "
        "run).\nothers: the share of the machine's CPUs used during the run by processes this "
        f"run did not start ('!' above {load.NOISY:.0%})"
    )


# --- main ---------------------------------------------------------------------------------


def _stop(signum: int, _frame: FrameType | None) -> None:
    if signum == signal.SIGALRM:
        raise SystemExit("bench.legacy: over its time limit; stopping everything it started")
    raise SystemExit(f"bench.legacy: {signal.Signals(signum).name}; stopping everything it started")


def main(
    seconds: int, connections: list[int], repeat: int, build: str, client: str, out: Path | None
) -> None:
    for tool in ("wrk", "redis-server"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (Debian: apt-get install {tool})")
    runs = len(connections) * repeat * len(TARGETS)
    limit = int(runs * (seconds + WARMUP_S + RUN_OVERHEAD_S) + STARTUP_ALLOWANCE_S)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGALRM, _stop)
    signal.alarm(limit)
    started_at = time.monotonic()
    assert __doc__ is not None
    report: dict[str, Any] = {
        "method": __doc__.strip(),
        "machine": load.machine(redis=["redis-server", "--version"]),
        "source": load.source("gateway", "bench"),
        "settings": {
            "seconds": seconds,
            "warmup_s": WARMUP_S,
            "connections": connections,
            "repeat": repeat,
            "build": build,
            "client": client,
            "protocol_version": VERSION,
            "wrk_threads": f"min(connections, {WRK_THREADS})",
            "wrk_timeout_s": load.WRK_TIMEOUT_S,
            "wrk_script": str(load.LUA.relative_to(procs.ROOT)),
            "order": "per connection count, per repeat: " + ", ".join(TARGETS),
            "time_limit_s": limit,
        },
    }
    m = report["machine"]
    print(f"bench.legacy: {m['nproc']} CPUs ({m['cpu_model']}), Python {m['python']}, ", end="")
    print(f"aiohttp {m['aiohttp']}, {m['redis'].split(' sha=')[0]}, {m['wrk'].split(' [')[0]}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}")
    changes = report["source"]["gateway_changes_not_committed"]
    print(f"taskgate at {report['source']['commit']}", end="")
    print(f", with uncommitted changes to gateway/: {len(changes)} file(s)" if changes else "")
    print(
        "on loopback: instant backend, redis-server, taskgate (1 process; ES256 JWT, Redis "
        "store, verified-token cache on, legacy on)"
    )
    threads = ", ".join(f"-t{min(c, WRK_THREADS)} -c{c}" for c in connections)
    print(f"wrk {threads}; every response checked; time limit {limit} s")
    what = (
        f"a 2026-07-28 client through taskgate to a backend spoken to in {VERSION}, against a "
        "2025-era client direct"
        if client == "2026"
        else f"2025 era (session {VERSION})"
    )
    print(f"measuring: {what}")
    with tempfile.TemporaryDirectory(prefix="taskgate-bench-legacy-") as tmp:
        with started(Path(tmp), build, client) as run:
            print(f"taskgate build: {run.setup['taskgate_version']}")
            requests, report["checks"] = prepare(run, client)
            report["requests"] = {
                name: {"body": request.body().decode(), "headers": request.shown_headers()}
                for name, request in requests.items()
            }
            print("measuring (per connection count, per repeat: direct, taskgate):")
            report["results"] = measure(run, requests, connections, seconds, repeat, what)
            for name, request in requests.items():
                if request.session:  # the client's own sessions (not taskgate's upstream ones)
                    end_session(run.urls[name], request, name)
            report["checks"]["sessions_ended"] = "DELETE 200, then 404"
        report["setup"] = run.setup
    signal.alarm(0)
    print_table(report["results"], seconds, what)
    report["elapsed_s"] = round(time.monotonic() - started_at, 1)
    left = report["setup"]["left_running"]
    stopped = f"stopped all {len(report['setup']['pids'])} processes it started"
    print(f"\nelapsed {report['elapsed_s']} s; " + (f"STILL RUNNING: {left}" if left else stopped))
    if out is not None:
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5, help="measured wrk run (default 5)")
    parser.add_argument(
        "--connections",
        type=connection_counts,
        default=[16],
        help="wrk connection counts, comma-separated (default 16)",
    )
    parser.add_argument(
        "--repeat", type=int, default=2, help="direct/taskgate pairs per count (default 2)"
    )
    parser.add_argument(
        "--build",
        choices=procs.BUILDS,
        help="taskgate's build to measure (default: pure under TASKGATE_PURE=1 or when there is "
        "no gateway/h1/server*.so, else compiled)",
    )
    parser.add_argument(
        "--client",
        choices=("2025", "2026"),
        default="2025",
        help="the era of the client through taskgate: 2025 (the front door, default) or 2026 "
        "(to a backend spoken to in the 2025 era)",
    )
    parser.add_argument("--json", type=Path, help="write every result here")
    args = parser.parse_args()
    if args.build is None:
        pure = os.environ.get("TASKGATE_PURE") or not procs.compiled_present()
        args.build = "pure" if pure else "compiled"
    if args.build == "compiled" and not procs.compiled_present():
        parser.error(
            "the compiled build was asked, but there is no gateway/h1/server*.so (make compile)"
        )
    if not 1 <= args.seconds <= 60:
        parser.error("--seconds must be 1..60 (the run is bounded)")
    if not 1 <= args.repeat <= 10:
        parser.error("--repeat must be 1..10 (the run is bounded)")
    main(args.seconds, args.connections, args.repeat, args.build, args.client, args.json)
