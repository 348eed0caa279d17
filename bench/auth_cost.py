"""The cost of JWT verification per request: in process, and through taskgate under load.

    python -m bench.auth_cost [--seconds 10] [--calls 4000] [--json out.json]

1. In process, per call, for ES256, RS256 (2048-bit) and EdDSA tokens: jwt.get_unverified_header
   (which taskgate calls before decoding), the signature check alone (pyjwt's Algorithm.verify),
   jwt.decode with the claims checks taskgate asks for, and JWTAuthenticator.authenticate() with
   the verified-token cache off (cache_size=0) and on (the same token every time). Each case
   runs `--calls` times after a warm-up, in rounds that interleave the cases so that drift on a
   shared machine hits all of them alike; one perf_counter_ns pair around each call (its own
   cost is measured and printed).
2. Under load, on loopback: one instant backend (bench/instant_backend.py) and, one at a time,
   taskgate (`python -m gateway run`, SQLite store in a temp dir) with auth none, ES256 and RS256
   with the token cache on and off (keys from PEM files). A task is created through taskgate
   with the token, one request is checked to answer 200 with the task (and, for jwt, that no
   token gets 401), then wrk (bench/wrk/mcp.lua, which checks every response) drives
   tasks/get for it: a short unrecorded warm-up, then `--seconds`. The backend is driven
   directly once as the reference. CPU time of taskgate, the backend and wrk is read from /proc
   and getrusage around the measured run and divided by the requests served; the machine's
   busy time (/proc/stat) minus theirs is what other processes used meanwhile. On a shared
   machine req/s and latencies move with that load; CPU µs per request hardly does.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import cryptography
import jwt
import orjson
from cryptography.hazmat.backends.openssl.backend import backend as openssl_backend
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from bench import load, procs
from gateway.auth.authenticator import JWTAuthenticator
from gateway.auth.jwks import StaticKeys
from gateway.auth.keys import VerificationKey
from gateway.auth.verify import Rules
from tests.support.issuer import AUDIENCE, ISSUER, Issuer, SigningKey, new_key

ALGS = ("ES256", "RS256", "EdDSA")
TOKEN_LIFETIME_S = 3600  # far longer than a run: no token expires while measured
WRK_THREADS, WRK_CONNECTIONS, WARMUP_S = 2, 16, 1
ROUNDS = 5


# --- 1. in process ------------------------------------------------------------------------


def percentile(samples: list[int], q: float) -> int:
    """Nearest rank, as bench/task_latency.py."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary_us(samples_ns: list[int]) -> dict[str, float]:
    return {
        "mean_us": round(statistics.fmean(samples_ns) / 1000, 2),
        "p50_us": round(percentile(samples_ns, 0.50) / 1000, 2),
        "p99_us": round(percentile(samples_ns, 0.99) / 1000, 2),
        "n": len(samples_ns),
    }


def time_sync(call: Callable[[], object], count: int, into: list[int]) -> None:
    clock = time.perf_counter_ns
    for _ in range(count):
        start = clock()
        call()
        into.append(clock() - start)


async def time_async(call: Callable[[], Awaitable[object]], count: int, into: list[int]) -> None:
    clock = time.perf_counter_ns
    for _ in range(count):
        start = clock()
        await call()
        into.append(clock() - start)


@dataclass
class Case:
    name: str
    sync: Callable[[], object] | None = None
    run: Callable[[], Awaitable[object]] | None = None

    async def measure(self, count: int, into: list[int]) -> None:
        if self.sync is not None:
            time_sync(self.sync, count, into)
        else:
            assert self.run is not None
            await time_async(self.run, count, into)


def rules(*algs: str) -> Rules:
    return Rules(
        issuer=ISSUER,
        audience=AUDIENCE,
        algorithms=frozenset(algs),
        tenant_claim="tenant",
        principal_claim="sub",
        leeway_s=30.0,
    )


def cases_for(alg: str) -> list[Case]:
    """The ways of checking one token of `alg`, each checked to succeed before timing."""
    signer = SigningKey(alg, new_key(alg))
    token = Issuer(keys=[signer]).token(lifetime_s=TOKEN_LIFETIME_S)
    public = VerificationKey(signer.kid, alg, signer.private.public_key())
    algorithm = jwt.get_algorithm_by_name(alg)
    signing_input, _, signature_b64 = token.rpartition(".")
    message, signature = signing_input.encode(), jwt.utils.base64url_decode(signature_b64)
    header = [f"Bearer {token}"]

    def signature_only() -> bool:
        return bool(algorithm.verify(message, public.key, signature))

    def decode() -> dict[str, Any]:
        claims: dict[str, Any] = jwt.decode(  # the arguments of gateway.auth.verify.verify
            token,
            public.key,
            algorithms=[alg],
            audience=AUDIENCE,
            issuer=ISSUER,
            leeway=30.0,
            options={"require": ["exp", "iss", "aud"], "verify_signature": True},
        )
        return claims

    uncached = JWTAuthenticator(rules(alg), StaticKeys((public,)), "x", cache_size=0)
    cached = JWTAuthenticator(rules(alg), StaticKeys((public,)), "x", cache_size=10_000)
    assert signature_only(), alg
    assert decode()["sub"] == "alice", alg
    return [
        Case(f"{alg} jwt.get_unverified_header", sync=lambda: jwt.get_unverified_header(token)),
        Case(f"{alg} signature only (pyjwt Algorithm.verify)", sync=signature_only),
        Case(f"{alg} jwt.decode (signature + claims)", sync=decode),
        Case(f"{alg} authenticate(), cache off", run=lambda: uncached.authenticate(header)),
        Case(f"{alg} authenticate(), cache on", run=lambda: cached.authenticate(header)),
    ]


async def microbench(calls: int, warmup: int) -> dict[str, Any]:
    cases = [case for alg in ALGS for case in cases_for(alg)]
    for case in cases:
        if case.run is not None:
            principal: Any = await case.run()
            assert (principal.tenant, principal.subject) == ("acme", "alice"), case.name
    timer: list[int] = []
    time_sync(lambda: None, calls, timer)
    samples: dict[str, list[int]] = {case.name: [] for case in cases}
    for case in cases:
        await case.measure(warmup, [])
    per_round = max(1, calls // ROUNDS)
    busy_before, ours_before = load.busy_cpu_s(), load.cpu_s(os.getpid())
    started = time.monotonic()
    for _ in range(ROUNDS):
        for case in cases:
            gc.collect()
            await case.measure(per_round, samples[case.name])
    elapsed = time.monotonic() - started
    busy = load.busy_cpu_s() - busy_before
    others = busy - (load.cpu_s(os.getpid()) - ours_before)
    return {
        "cpu_share": {  # of the whole machine while timing: others ran beside this process
            "all": round(busy / (elapsed * load.CPUS), 3),
            "other_processes": round(max(0.0, others) / (elapsed * load.CPUS), 3),
        },
        "calls_per_case": per_round * ROUNDS,
        "warmup_calls_per_case": warmup,
        "rounds": ROUNDS,
        "timer_overhead": summary_us(timer),
        "cases": {name: summary_us(s) for name, s in samples.items()},
    }


# --- 2. under load ------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    name: str
    auth: dict[str, Any] | None  # None: the backend directly
    token: str = ""


async def rpc(
    http: aiohttp.ClientSession,
    url: str,
    method: str,
    params: dict[str, Any],
    name: str,
    token: str,
) -> tuple[int, Any]:
    request = load.Request(method, params, name=name, token=token)
    async with http.post(url, data=request.body(), headers=request.headers()) as response:
        return response.status, orjson.loads(await response.read())


async def create_and_check(url: str, setup: Setup) -> str:
    """A new task's id, after one tasks/get of it answered 200 with the task (and, with jwt,
    one without a token answered 401): a misconfiguration must not be measured as speed."""
    async with aiohttp.ClientSession() as http:
        call = {"name": "make_task", "arguments": {}}
        status, created = await rpc(http, url, "tools/call", call, "make_task", setup.token)
        if status != 200 or "taskId" not in created.get("result", {}):
            raise SystemExit(f"{setup.name}: make_task answered {status}: {created}")
        task_id: str = created["result"]["taskId"]
        status, got = await rpc(http, url, "tasks/get", {"taskId": task_id}, task_id, setup.token)
        if status != 200 or got.get("result", {}).get("taskId") != task_id:
            raise SystemExit(f"{setup.name}: tasks/get answered {status}: {got}")
        if setup.auth is not None and setup.auth["mode"] == "jwt":
            status, refused = await rpc(http, url, "tasks/get", {"taskId": task_id}, task_id, "")
            if status != 401:
                raise SystemExit(f"{setup.name}: tasks/get without a token got {status}: {refused}")
    return task_id


def drive(
    url: str, setup: Setup, task_id: str, pids: dict[str, int], seconds: int
) -> dict[str, Any]:
    """A warm-up, then the measured wrk run; fails loudly on any response that is not the task."""
    params = {"taskId": task_id}
    request = load.Request("tasks/get", params, name=task_id, expect=task_id, token=setup.token)
    return load.drive(
        setup.name,
        url,
        request,
        pids,
        seconds=seconds,
        connections=WRK_CONNECTIONS,
        threads=WRK_THREADS,
        warmup_s=WARMUP_S,
    )


def pem(key: SigningKey, path: Path) -> str:
    public = key.private.public_key()
    path.write_bytes(public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    return str(path)


def setups(work: Path) -> list[Setup]:
    es, rs = SigningKey("ES256", new_key("ES256")), SigningKey("RS256", new_key("RS256"))
    issuer = Issuer(keys=[es, rs])
    made = [Setup("auth none", {"mode": "none"})]
    for key, label in ((es, "ES256"), (rs, "RS256 2048")):
        token = issuer.token(key=key, lifetime_s=TOKEN_LIFETIME_S)
        file = pem(key, work / f"{key.alg}.pem")
        for cache in (10_000, 0):
            auth = {
                "mode": "jwt",
                "issuer": ISSUER,
                "audience": AUDIENCE,
                "algorithms": [key.alg],
                "keys": [{"kid": key.kid, "alg": key.alg, "file": file}],
                "token_cache_size": cache,
            }
            name = f"jwt {label}, " + ("cache on" if cache else "cache off")
            made.append(Setup(name, auth, token))
    return made


def slug(name: str) -> str:
    return re.sub(r"\W+", "_", name).strip("_")


def config(work: Path, name: str, port: int, backend: str, auth: dict[str, Any]) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "store": {"url": f"sqlite:///{work}/{slug(name)}.db", "cache_size": 10_000},
        "auth": auth,
        "backends": {"reports": {"replicas": [backend]}},
        "routes": [{"tools": ["*"], "backend": "reports"}],
    }


async def throughput(seconds: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="taskgate-auth-bench-") as tmp:
        work = Path(tmp)
        backend_port = procs.free_port()
        direct = f"http://127.0.0.1:{backend_port}/mcp"
        with procs.instant_backend(backend_port) as backend:
            reference = Setup("direct (instant backend)", None)
            task_id = await create_and_check(direct, reference)
            pids = {"backend": backend.pid}
            results[reference.name] = await asyncio.to_thread(
                drive, direct, reference, task_id, pids, seconds
            )
            results[reference.name]["backend_command"] = load.argv_of(backend)
            for setup in setups(work):
                assert setup.auth is not None
                port = procs.free_port()
                settings = config(work, setup.name, port, direct, setup.auth)
                path = work / f"{slug(setup.name)}.yaml"
                # JSON is YAML: the file holds exactly the settings recorded below.
                path.write_text(json.dumps(settings, indent=2) + "\n")
                with procs.taskgate(path, port) as gateway:
                    url = f"http://127.0.0.1:{port}/mcp"
                    task_id = await create_and_check(url, setup)
                    pids_now = {**pids, "taskgate": gateway.pid}
                    run = await asyncio.to_thread(drive, url, setup, task_id, pids_now, seconds)
                results[setup.name] = {
                    **run,
                    "taskgate_command": load.argv_of(gateway),
                    "taskgate_config": settings,
                }
    none = results["auth none"]["requests_per_s"]
    reference_rps = results["direct (instant backend)"]["requests_per_s"]
    none_cpu = results["auth none"]["cpu_us_per_request"]["taskgate"]
    for found in results.values():
        found["ratio_vs_auth_none"] = round(found["requests_per_s"] / none, 3)
        found["ratio_vs_direct"] = round(found["requests_per_s"] / reference_rps, 3)
        if "taskgate" in found["cpu_us_per_request"]:
            gateway_cpu = found["cpu_us_per_request"]["taskgate"]
            found["taskgate_cpu_us_added_vs_auth_none"] = round(gateway_cpu - none_cpu, 1)
            # taskgate is one process with one event loop: this is its ceiling on one free CPU.
            found["req_per_s_if_taskgate_cpu_bound"] = round(1e6 / gateway_cpu)
    return results


# --- report -------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    return {
        **load.machine(),
        "pyjwt": jwt.__version__,
        "cryptography": cryptography.__version__,
        "openssl": openssl_backend.openssl_version_text(),
    }


def print_micro(micro: dict[str, Any]) -> None:
    timer = micro["timer_overhead"]
    print(
        f"\nIn process: µs per call, {micro['calls_per_case']} calls per case in "
        f"{micro['rounds']} interleaved rounds after {micro['warmup_calls_per_case']} warm-up "
        f"calls (timer pair alone: mean {timer['mean_us']} µs, p50 {timer['p50_us']} µs);\n"
        f"other processes kept {micro['cpu_share']['other_processes']:.0%} of the machine's "
        f"CPUs busy meanwhile"
    )
    print(f"{'case':<48}{'mean':>9}{'p50':>9}{'p99':>9}")
    for name, found in micro["cases"].items():
        print(f"{name:<48}{found['mean_us']:>9.2f}{found['p50_us']:>9.2f}{found['p99_us']:>9.2f}")


def print_throughput(results: dict[str, Any], seconds: int) -> None:
    print(
        f"\nUnder load: tasks/get, wrk -t{WRK_THREADS} -c{WRK_CONNECTIONS} -d{seconds}s "
        f"(after a {WARMUP_S} s warm-up), one run each. gw/be/wrk cpu: CPU µs per request of\n"
        f"taskgate, the backend, wrk; +gw: taskgate's CPU µs per request minus auth none's; "
        f"busy: the machine's\nCPUs busy during the run; others: the part of it used by "
        f"processes this benchmark did not start"
    )
    head = (
        f"{'configuration':<28}{'req/s':>9}{'p50 ms':>8}{'p99 ms':>8}{'x none':>7}{'x direct':>9}"
    )
    print(f"{head}{'gw cpu':>8}{'+gw':>7}{'be cpu':>8}{'wrk cpu':>8}{'busy':>6}{'others':>7}")
    for name, found in results.items():
        cpu, share = found["cpu_us_per_request"], found["cpu_share"]
        gw = f"{cpu['taskgate']:>8.1f}" if "taskgate" in cpu else f"{'-':>8}"
        added = found.get("taskgate_cpu_us_added_vs_auth_none")
        gw += f"{added:>+7.1f}" if added is not None else f"{'-':>7}"
        print(
            f"{name:<28}{found['requests_per_s']:>9.0f}{found['p50_ms']:>8.2f}"
            f"{found['p99_ms']:>8.2f}{found['ratio_vs_auth_none']:>7.2f}"
            f"{found['ratio_vs_direct']:>9.2f}{gw}{cpu['backend']:>8.1f}{cpu['wrk']:>8.1f}"
            f"{share['all']:>6.0%}{share['other_processes']:>7.0%}"
            + (" !" if share["other_processes"] > load.NOISY else "")
        )
    print(
        "p50/p99: wrk --latency, which adds coordinated-omission samples for stalls (max and "
        "Little's-law means are in the JSON)."
    )
    if any(r["cpu_share"]["other_processes"] > load.NOISY for r in results.values()):
        print(
            f"! other processes used more than {load.NOISY:.0%} of the machine during this run: "
            "its req/s and latencies say more about them than about taskgate; compare gw cpu."
        )


async def main(seconds: int, calls: int, out: Path | None) -> None:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    started = time.monotonic()
    assert __doc__ is not None
    results: dict[str, Any] = {
        "method": __doc__.strip(),
        "machine": machine(),
        "source": load.source("gateway"),
        "settings": {
            "seconds": seconds,
            "calls": calls,
            "wrk": {
                "threads": WRK_THREADS,
                "connections": WRK_CONNECTIONS,
                "timeout_s": load.WRK_TIMEOUT_S,
                "warmup_s": WARMUP_S,
                "script": str(load.LUA.relative_to(procs.ROOT)),
            },
            "token_lifetime_s": TOKEN_LIFETIME_S,
        },
    }
    m = results["machine"]
    print(f"bench.auth_cost: {m['nproc']} CPUs ({m['cpu_model']}), Python {m['python']}, ", end="")
    print(f"pyjwt {m['pyjwt']}, cryptography {m['cryptography']} ({m['openssl']})")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}")
    changes = results["source"]["gateway_changes_not_committed"]
    print(f"taskgate at {results['source']['commit']} in {results['source']['root']}", end="")
    print(f", with uncommitted changes to gateway/: {changes}" if changes else "")
    results["micro"] = await microbench(calls, warmup=max(100, calls // 10))
    print_micro(results["micro"])
    results["throughput"] = await throughput(seconds)
    print_throughput(results["throughput"], seconds)
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    print(f"\nelapsed {results['elapsed_s']} s; single runs: differences of a few % are noise")
    if out is not None:
        await asyncio.to_thread(out.write_text, json.dumps(results, indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10, help="wrk duration per configuration")
    parser.add_argument("--calls", type=int, default=4000, help="timed calls per in-process case")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not 1 <= args.seconds <= 120 or not 100 <= args.calls <= 100_000:
        parser.error("--seconds must be 1..120 and --calls 100..100000 (the run is bounded)")
    asyncio.run(main(args.seconds, args.calls, args.json))
