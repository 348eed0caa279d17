"""What bench/isolation.py prints: how it measured, B's service per phase, A's counts, CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from bench import load, procs

GOAL_RATIO = 2.0  # B's p99 while A floods, at most this many times its p99 alone
ALONE, FLOODED = "B alone", "B while A floods"


def header(method: str, seconds: int, limit: int, env: dict[str, str] | None) -> dict[str, Any]:
    """The machine, the source and the build measured: printed, and returned as the report's
    start."""
    machine = load.machine(redis=["redis-server", "--version"])
    source = load.source("gateway", "bench")
    argv = [sys.executable, "-m", "gateway", "--version"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=procs.ROOT,
                          env=env, timeout=60)  # fmt: skip
    build = ((done.stdout + done.stderr).strip().splitlines() or ["unknown"])[0]
    redis = machine["redis"].split(" sha=")[0]
    print(f"bench.isolation: {machine['nproc']} CPUs ({machine['cpu_model']}), Python "
          f"{machine['python']}, aiohttp {machine['aiohttp']}, {redis}")  # fmt: skip
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in machine['loadavg_at_start'])}")
    changes = source["gateway_changes_not_committed"]
    dirty = f", with uncommitted changes to gateway/: {len(changes)} file(s)" if changes else ""
    print(f"taskgate at {source['commit']}{dirty}")
    print(f"build: {build}; time limit {limit} s")
    settings = {"seconds": seconds, "time_limit_s": limit, "build": build}
    return {"method": method.strip(), "machine": machine, "source": source, "settings": settings}


def print_setup(settings: dict[str, Any]) -> None:
    config = settings["taskgate_config"]
    backend = config["backends"]["instant"]["max_in_flight"]
    print(
        "on loopback: the instant backend, redis-server (--save '' --appendonly no), and two "
        "taskgates on that Redis,\neach: ES256 JWT (tenant claim `tenant`), Redis store, route "
        f"* to the backend, listen.max_in_flight {config['listen']['max_in_flight']},\n"
        f"backends.instant.max_in_flight {backend}, "
        f"limits: {json.dumps(config['limits']).replace(chr(34), '')}"
    )
    b, a = settings["b"], settings["a"]
    print(
        f'tenant B ("{b["tenant"]}"): a paced closed loop of {b["rate_per_s"]:g} req/s over both '
        f"instances: {b['workers_per_instance']} connections per instance,\n  each one request "
        f"every {b['interval_s'] * 1000:.1f} ms (tools/call echo and tasks/get of its task in "
        f"turn),\n  and make_task every {b['create_every_s']:g} s on each instance in turn; "
        f"{b['warmup_s']:g} s warm-up unrecorded; timed from each send, {b['timeout_s']:g} s "
        "timeout"
    )
    kinds = {"rate": "tools/call echo", "slow": f"tools/call slow {a['slow_ms']} ms, re-sent",
             "create": "tools/call make_task", "poll": "tasks/get of its task"}  # fmt: skip
    shown = ", ".join(f"{kind} {n} ({kinds[kind]})" for kind, n in a["connections"].items())
    print(
        f'tenant A ("{a["tenant"]}"), a process of its own, connections split evenly over both '
        f"instances, each back to back, refusals ignored:\n  {shown}"
    )
    print(
        f"phases: {ALONE} {settings['seconds']} s, then {FLOODED} {settings['seconds']} s "
        "(A READY, every kind answered, before that clock starts; stopped after it)"
    )


def _b_row(name: str, b: dict[str, Any]) -> str:
    return (
        f"{name:<18}{b['requests']:>9}{b['success_ratio']:>10.3%}{b['p50_ms']:>9.2f}"
        f"{b['p99_ms']:>9.2f}{b['max_ms']:>9.2f}{b['requests_per_s']:>8.1f}{b['late']:>6}"
    )


def print_b(phases: dict[str, Any]) -> dict[str, Any]:
    """B's table, the ratio and the goal line; the goal's figures."""
    head = f"{'requests':>9}{'success':>10}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'req/s':>8}"
    print(f"\n{'tenant B':<18}{head}{'late':>6}")
    for name, found in phases.items():
        print(_b_row(name, found["b"]))
        kinds = found["b"]["by_kind"].items()
        print("  " + "; ".join(f"{kind} {k['requests']}, {k['success_ratio']:.3%}, p99 "
                               f"{k['p99_ms']:.2f} ms" for kind, k in kinds))  # fmt: skip
    alone, during = phases[ALONE]["b"], phases[FLOODED]["b"]
    ratio = round(during["p99_ms"] / alone["p99_ms"], 2) if alone["p99_ms"] else None
    kept = alone["success_ratio"] == 1.0 and during["success_ratio"] == 1.0
    met = kept and ratio is not None and ratio <= GOAL_RATIO
    print(f"p99 while A floods / p99 alone: {ratio}x")
    print(
        f"goal, B keeps 100% success and p99 within {GOAL_RATIO:g}x: "
        f"{'met' if met else 'NOT MET'} (success {alone['success_ratio']:.3%} alone, "
        f"{during['success_ratio']:.3%} while A floods; p99 {ratio}x)"
    )
    for name, found in phases.items():
        failures = found["b"]["failures"]
        if failures["failure_samples"]:
            statuses = failures["refused_by_status"] | failures["other_failures_by_status"]
            print(f"B's failures, {name}: by status {statuses}, the first ones:")
            for sample in failures["failure_samples"]:
                print(f"  {sample}")
    return {"p99_ratio": ratio, "success_kept": kept, "met": met}


def print_a(a: dict[str, Any]) -> None:
    head = f"{'sent':>9}{'/s':>9}{'succeeded':>10}{'429':>8}{'503':>8}{'other':>7}"
    print(f"\ntenant A, {a['seconds']} s{'':<7}{'conns':>6}{head}{'unanswered':>11}")
    for kind, k in [*a["kinds"].items(), ("all", a["all"])]:
        refused = k["refused_by_status"]
        other = sum(k["other_failures_by_status"].values())
        print(
            f"  {kind:<20}{k.get('connections', ''):>6}{k['sent']:>9}{k.get('sent_per_s', ''):>9}"
            f"{k['succeeded']:>10}{refused.get('429', 0):>8}{refused.get('503', 0):>8}"
            f"{other:>7}{k['sent'] - k['answered']:>11}"
        )
    for kind, k in a["kinds"].items():
        print(f"  {kind} refused by data.limit: {k['refused_by_limit'] or 'none'}")
    for which, body in sorted(a["all"]["first_refusal_bodies"].items()):
        print(f"  first refusal {which}: {body}")
    if a["all"]["failure_samples"]:
        print(
            f"  A's other failures by status: {a['all']['other_failures_by_status']}, first ones:"
        )
        for sample in a["all"]["failure_samples"]:
            print(f"    {sample}")


def print_cpu(phases: dict[str, Any], cpus: int) -> None:
    names = list(phases[FLOODED]["cpu_of_one_cpu"])
    print(
        "\nCPU per phase, in CPUs (1.0: one CPU busy the whole phase; each taskgate with its "
        "workers):\n" + f"{'':<18}" + "".join(f"{name:>12}" for name in names)
    )
    for name, found in phases.items():
        shares = found["cpu_of_one_cpu"]
        print(f"{name:<18}" + "".join(f"{shares.get(n, 0.0):>12.2f}" for n in names))
    others = max(found["cpu_of_one_cpu"]["others"] for found in phases.values()) / cpus
    if others > load.NOISY:
        print(
            f"! processes this run did not start used {others:.0%} of the machine's {cpus} CPUs "
            "in a phase: its latencies say as much about that load as about taskgate"
        )


def print_results(found: dict[str, Any]) -> None:
    found["goal"] = print_b(found["phases"])
    print_a(found["a"])
    print_cpu(found["phases"], found["machine"]["nproc"] or 1)
    left = found["left_running"]
    print(f"\nSTILL RUNNING: {left}" if left else "\nstopped every process it started")
