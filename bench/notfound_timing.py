"""Whether a foreign task id and an unknown one take the same time to be refused.

    python -m bench.notfound_timing [--requests 1000] [--store redis|sqlite] [--cache-size N]
                                    [--build compiled|pure] [--seed S] [--json out.json]

Starts on loopback, each as a process of its own, and stops them all by pid at the end: the
instant backend (bench/instant_backend.py), a redis-server (`--save '' --appendonly no`, with
--store redis) and taskgate (`python -m gateway run`, the build --build names, checked with
`--version` as bench/run.py does) with ES256 JWT auth, the store --store names (Redis, or SQLite
in the temp dir), the route cache of --cache-size (default 10,000, taskgate's default), the
request log on (its default) and route `*` to the backend.

Tenant A (acme/alice) creates a task through taskgate and polls it once, so that its route is
in the route cache of the process measured (the warm case: what an attacker meets on a busy
gateway). Then tenant B (globex/bob, a valid token) sends tasks/get over three keep-alive
connections, with the same request id, the same headers and an id of the same length, so that
only the id differs:

- foreign: the id of A's task, again and again;
- unknown: a fresh random id each time (the alphabet and length of the backend's ids), never
  created, so that nothing in taskgate can have seen it;
- unknown-again: one never-created id, again and again (seen before, as the foreign one is:
  whatever taskgate remembers of ids it was asked for, it remembers of both).

After an unrecorded warm-up of --warmup requests per series, the series take turns, one request
each per round in a random order (drift and ordering hit all alike), N rounds (--requests);
each series has a connection of its own in a round, the next one in the next round.
Each time is from the first byte sent to the last byte of the answer read, on a raw socket (no
client library between). Every answer must be the one "Task not found" (HTTP 200, JSON-RPC
-32602), the same body byte for byte and the same headers (Date aside) in every series, else
the run stops. Printed: the median, p10 and p90 of each series; for foreign against each
unknown series, the difference of the medians with a bootstrap 95% interval (--resamples
resamplings of each series with replacement; the 2.5th and 97.5th percentiles), and the median
of the paired differences (each foreign time minus the other series' time of the same round),
less disturbed by a shared machine's drift, with its own bootstrap interval (rounds resampled).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import socket
import statistics
import string
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from bench import load, procs
from tests.support.issuer import AUDIENCE, ISSUER, Issuer, SigningKey, new_key

TOKEN_LIFETIME_S = 3600  # far longer than a run: the verified-token cache serves both series
URLSAFE = string.ascii_letters + string.digits + "-_"  # the backend's ids: token_urlsafe
READ_TIMEOUT_S = 10.0
REQUEST_ID = 1
SERIES = ("foreign", "unknown", "unknown-again")
COMPARED = (("foreign", "unknown"), ("foreign", "unknown-again"))


@dataclass
class Started:
    url: str
    port: int
    token_a: str
    token_b: str
    setup: dict[str, Any]


def taskgate_settings(
    work: Path, port: int, backend: str, store: str, cache_size: int, signer: SigningKey
) -> dict[str, Any]:
    pem = work / "es256.pem"
    public = signer.private.public_key()
    pem.write_bytes(public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "store": {"url": store, "cache_size": cache_size},
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


@contextlib.contextmanager
def started(work: Path, build: str, store: str, cache_size: int) -> Iterator[Started]:
    """The backend, redis (for --store redis) and taskgate's `build` on loopback, in `work`;
    all stopped by pid at the end."""
    env = procs.build_env(build)
    version = procs.build_version(build, env)  # before anything starts: the build named runs
    names = ("backend", "redis", "taskgate")
    ports = dict(zip(names, procs.free_ports(len(names)), strict=True))
    direct = f"http://127.0.0.1:{ports['backend']}/mcp"
    with contextlib.ExitStack() as stack:
        everything = {"backend": stack.enter_context(procs.instant_backend(ports["backend"]))}
        if store == "redis":
            (work / "redis").mkdir()
            everything["redis"] = stack.enter_context(procs.redis(ports["redis"], work / "redis"))
            store_url = f"redis://127.0.0.1:{ports['redis']}/0"
        else:
            store_url = f"sqlite:///{work / 'routes.db'}"
        signer = SigningKey("ES256", new_key("ES256"))
        settings = taskgate_settings(work, ports["taskgate"], direct, store_url, cache_size, signer)
        config_path = work / "taskgate.yaml"
        config_path.write_text(json.dumps(settings, indent=2) + "\n")  # JSON is YAML
        argv = [sys.executable, "-m", "gateway", "run", "--config", str(config_path)]
        argv += ["--log-level", "warning"]
        taskgate = stack.enter_context(procs.started(argv, ports["taskgate"], env))
        everything["taskgate"] = taskgate
        procs.check_running_build(build, procs.compiled_files_mapped(load.tree(taskgate.pid)))
        issuer = Issuer(keys=[signer])
        setup: dict[str, Any] = {
            "build": build,
            "taskgate_version": version,
            "ports": ports,
            "commands": {name: load.argv_of(proc) for name, proc in everything.items()},
            "taskgate_config": settings,
        }
        try:
            yield Started(
                f"http://127.0.0.1:{ports['taskgate']}/mcp",
                ports["taskgate"],
                issuer.token("acme", "alice", lifetime_s=TOKEN_LIFETIME_S),
                issuer.token("globex", "bob", lifetime_s=TOKEN_LIFETIME_S),
                setup,
            )
        finally:
            ours = {pid for proc in everything.values() for pid in load.tree(proc.pid)}
            stack.close()
            left = [pid for pid in ours if procs.alive(pid)]
            if left:
                print(f"! processes this run started are still running: {left}", file=sys.stderr)


# --- one keep-alive connection, raw -------------------------------------------------------


def request_bytes(port: int, token: str, task_id: str) -> bytes:
    """tasks/get of `task_id` as one HTTP/1.1 request, headers as bench/load.py sends them."""
    request = load.Request("tasks/get", {"taskId": task_id}, name=task_id, token=token)
    body = request.body()  # id 1 (REQUEST_ID), params with the 2026-07-28 _meta
    lines = ["POST /mcp HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    lines += [f"{name}: {value}" for name, value in request.headers().items()]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Connection:
    """One keep-alive connection to taskgate; `exchange` sends a request and reads its whole
    answer (taskgate's not-found answers carry Content-Length)."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._rest = b""

    def exchange(self, raw: bytes) -> tuple[int, bytes, bytes]:
        """Nanoseconds from the first byte sent to the answer's last byte, its head, its body."""
        sock = self._sock
        started = time.perf_counter_ns()
        sock.sendall(raw)
        data = self._rest
        end = data.find(b"\r\n\r\n")
        while end < 0:
            data += self._recv()
            end = data.find(b"\r\n\r\n")
        head = data[:end]
        length = _content_length(head)
        while len(data) < end + 4 + length:
            data += self._recv()
        elapsed = time.perf_counter_ns() - started
        body = data[end + 4 : end + 4 + length]
        self._rest = data[end + 4 + length :]
        return elapsed, head, body

    def _recv(self) -> bytes:
        chunk = self._sock.recv(65536)
        if not chunk:
            raise SystemExit("taskgate closed the keep-alive connection")
        return chunk

    def close(self) -> None:
        self._sock.close()


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise SystemExit(f"an answer without Content-Length: {head!r}")


def head_but_date(head: bytes) -> list[bytes]:
    lines = head.split(b"\r\n")
    return [lines[0], *sorted(line for line in lines[1:] if not line.lower().startswith(b"date:"))]


# --- the run ------------------------------------------------------------------------------

Answer = tuple[list[bytes], bytes]  # the head's lines (status first, Date left out), the body


def create_task(run: Started) -> str:
    """A task created by tenant A through taskgate (its route recorded), then polled by A once
    so that the route is in the process's route cache."""
    make = {"name": "make_task", "arguments": {}}
    create = load.Request(
        "tools/call", make, name="make_task", expect='"taskId"', token=run.token_a
    )
    answer, _ = load.check(run.url, create, "tenant A's make_task")
    task_id: str = answer["result"]["taskId"]
    poll = load.Request(
        "tasks/get", {"taskId": task_id}, name=task_id, expect=task_id, token=run.token_a
    )
    load.check(run.url, poll, "tenant A's tasks/get")
    return task_id


def unknown_id(like: str, rng: random.Random) -> str:
    return "".join(rng.choices(URLSAFE, k=len(like)))


def measure(
    run: Started, task_id: str, requests: int, warmup: int, rng: random.Random
) -> tuple[dict[str, list[int]], Answer]:
    """Each series' times (ns), and the one answer every request got."""
    # Every request built before the clock starts; the fresh ids are never the task's own.
    again = request_bytes(run.port, run.token_b, unknown_id(task_id, rng))
    fresh = [
        request_bytes(run.port, run.token_b, unknown_id(task_id, rng))
        for _ in range(warmup + requests)
    ]
    foreign = request_bytes(run.port, run.token_b, task_id)
    connections = [Connection(run.port) for _ in SERIES]
    samples: dict[str, list[int]] = {side: [] for side in SERIES}
    expected: list[Answer] = []
    try:
        for i in range(warmup + requests):
            order = list(enumerate(SERIES))
            rng.shuffle(order)
            for k, side in order:
                raw = foreign if side == "foreign" else fresh[i] if side == "unknown" else again
                # Each round moves every series to the next connection: a connection's own
                # bias (about 1 us, seen in a run with the same bytes in two series) cancels.
                connection = connections[(i + k) % len(connections)]
                elapsed, head, body = connection.exchange(raw)
                check_answer(side, head, body, expected)
                if i >= warmup:
                    samples[side].append(elapsed)
    finally:
        for each in connections:
            each.close()
    return samples, expected[0]


def check_answer(side: str, head: bytes, body: bytes, expected: list[Answer]) -> None:
    """The one not-found answer, the same for every series (headers but Date, and body)."""
    answer = orjson.loads(body)
    error = answer.get("error") if isinstance(answer, dict) else None
    if (
        not head.startswith(b"HTTP/1.1 200")
        or not isinstance(error, dict)
        or (error.get("code") != -32602 or answer.get("id") != REQUEST_ID)
    ):
        raise SystemExit(f"{side}: not the one 'Task not found': {head!r} {body!r}")
    seen = (head_but_date(head), body)
    if not expected:
        expected.append(seen)
    elif seen != expected[0]:
        raise SystemExit(f"{side}: an answer unlike the others: {seen!r} != {expected[0]!r}")


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def interval(estimates: list[float]) -> list[float]:
    ordered = sorted(estimates)
    return [round(percentile(ordered, 0.025), 2), round(percentile(ordered, 0.975), 2)]


def compare(a: list[float], b: list[float], resamples: int, rng: random.Random) -> dict[str, Any]:
    """median(a) - median(b) with a bootstrap 95% interval (each series resampled), and the
    median of the paired differences a[i] - b[i] with one of its own (the pairs resampled)."""
    median = statistics.median
    pairs = [x - y for x, y in zip(a, b, strict=True)]
    return {
        "median_difference_us": round(median(a) - median(b), 2),
        "interval_us": interval(
            [
                median(rng.choices(a, k=len(a))) - median(rng.choices(b, k=len(b)))
                for _ in range(resamples)
            ]
        ),
        "paired_median_us": round(median(pairs), 2),
        "paired_interval_us": interval(
            [median(rng.choices(pairs, k=len(pairs))) for _ in range(resamples)]
        ),
    }


def summarise(samples: dict[str, list[int]], resamples: int, rng: random.Random) -> dict[str, Any]:
    us = {side: [ns / 1000 for ns in values] for side, values in samples.items()}
    result: dict[str, Any] = {}
    for side, values in us.items():
        ordered = sorted(values)
        result[side] = {
            "n": len(values),
            "median_us": round(statistics.median(values), 2),
            "p10_us": round(percentile(ordered, 0.10), 2),
            "p90_us": round(percentile(ordered, 0.90), 2),
        }
    for a, b in COMPARED:
        result[f"{a} - {b}"] = compare(us[a], us[b], resamples, rng)
    return result


def main(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    print(__doc__.strip().splitlines()[0])
    print(
        f"tasks/get by tenant B, {args.requests} of each series ({', '.join(SERIES)}), "
        "interleaved in random order per round, over 3 keep-alive connections in turn, after "
        f"{args.warmup} unrecorded each; store {args.store}, route cache {args.cache_size}, "
        f"build {args.build}"
    )
    with (
        tempfile.TemporaryDirectory(prefix="taskgate-bench-") as tmp,
        started(Path(tmp), args.build, args.store, args.cache_size) as run,
    ):
        print(f"taskgate: {run.setup['taskgate_version']}")
        task_id = create_task(run)
        samples, answer = measure(run, task_id, args.requests, args.warmup, rng)
    result = summarise(samples, args.resamples, rng)
    for side in SERIES:
        shown = result[side]
        print(
            f"  {side:13} median {shown['median_us']:7.1f} us  p10 {shown['p10_us']:7.1f} us  "
            f"p90 {shown['p90_us']:7.1f} us  (n={shown['n']})"
        )
    for a, b in COMPARED:
        shown = result[f"{a} - {b}"]
        low, high = shown["interval_us"]
        paired_low, paired_high = shown["paired_interval_us"]
        print(
            f"  {a} - {b}: medians {shown['median_difference_us']:+.1f} us (95% interval "
            f"{low:+.1f} .. {high:+.1f}); paired {shown['paired_median_us']:+.1f} us "
            f"({paired_low:+.1f} .. {paired_high:+.1f})"
        )
    head, body = answer
    print(
        f"  every answer: {head[0].decode()}, the same {len(body)}-byte body and headers "
        f"(Date aside); intervals: bootstrap, {args.resamples} resamples"
    )
    if args.json is not None:
        record = {
            "method": __doc__.strip(),
            "arguments": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "setup": run.setup,
            "result": result,
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="per series (default 1000)")
    parser.add_argument("--warmup", type=int, default=100, help="per series (default 100)")
    parser.add_argument("--store", choices=("redis", "sqlite"), default="redis")
    parser.add_argument("--cache-size", type=int, default=10_000)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--seed", type=int, help="of the order, the ids and the bootstrap")
    parser.add_argument(
        "--build",
        choices=procs.BUILDS,
        help="taskgate's build to measure (default: pure under TASKGATE_PURE=1 or when there is "
        "no gateway/h1/server*.so, else compiled)",
    )
    parser.add_argument("--json", type=Path, help="write every result here")
    args = parser.parse_args()
    if args.build is None:
        pure = os.environ.get("TASKGATE_PURE") or not procs.compiled_present()
        args.build = "pure" if pure else "compiled"
    if args.build == "compiled" and not procs.compiled_present():
        parser.error("the compiled build was asked, but there is no gateway/h1/server*.so")
    if not 10 <= args.requests <= 100_000:
        parser.error("--requests must be 10..100000 (the run is bounded)")
    if not 0 <= args.warmup <= 10_000:
        parser.error("--warmup must be 0..10000")
    main(args)
