"""Both tenants' loads for bench/isolation.py: A's flood (a process of its own), B's paced loop.

    python -m bench.isolation_load --urls URL,URL --token-file F --task ID --out F.json

Run so, it is tenant A's flood: four kinds of abuse against every taskgate in --urls at once,
each kind on connections of its own, split evenly over the instances (FLOOD: the connections
over all of them): `rate`, tools/call echo back to back; `slow`, tools/call slow held SLOW_MS
and sent again as each ends; `create`, tools/call make_task back to back; `poll`, tasks/get of
task --task back to back. Refusals are ignored (no Retry-After honoured): A is the abuser. It
prints READY once every kind has had an answer, runs until SIGTERM (or --deadline-s), cancels
what is in flight, and writes its counts to --out. A process of its own, so that its client's
CPU is not spent in the event loop that times tenant B.

Imported, it is B's paced closed loop (`paced`) and how both count answers (`exchange`, `Tally`,
`summary`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench import load

READY = "READY"
SLOW_MS = 2000
FLOOD = {"rate": 32, "slow": 100, "create": 8, "poll": 8}  # connections, over all instances
REFUSED = (429, 503)
TIMEOUT_S = 10.0  # a request's deadline (B's and A's): a slow call takes SLOW_MS
SAMPLES = 5  # failure bodies kept per tally
DEADLINE_S = 600.0  # the flood's own bound, should its parent never stop it


# --- one exchange, classified ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int  # 0: no HTTP answer (connection error or timeout)
    ok: bool  # HTTP 200 with a JSON-RPC result
    limit: str  # a JSON-RPC error's data.limit ("" when none)
    body: bytes
    ms: float


def _message(body: bytes) -> dict[str, Any] | None:
    """The JSON-RPC message of a JSON body, or the last one of an event stream's data lines."""
    found: Any = None
    if body.lstrip().startswith(b"{"):
        with contextlib.suppress(orjson.JSONDecodeError):
            found = orjson.loads(body)
    else:
        for line in body.splitlines():
            if line.startswith(b"data:"):
                with contextlib.suppress(orjson.JSONDecodeError):
                    message = orjson.loads(line[5:])
                    if isinstance(message, dict) and ("result" in message or "error" in message):
                        found = message
    return found if isinstance(found, dict) else None


def classify(status: int, body: bytes, ms: float) -> Answer:
    message = _message(body)
    ok = status == 200 and message is not None and "result" in message
    limit = ""
    error = message.get("error") if message is not None else None
    if isinstance(error, dict) and isinstance(error.get("data"), dict):
        limit = str(error["data"].get("limit", ""))
    return Answer(status, ok, limit, body, ms)


async def exchange(session: aiohttp.ClientSession, url: str, request: load.Request) -> Answer:
    """Send `request` once; its answer classified (a failure to get one is status 0)."""
    started = time.perf_counter()
    try:
        async with session.post(url, data=request.body(), headers=request.headers()) as response:
            body = await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        body, status = f"{type(exc).__name__}: {exc}".encode(), 0
    return classify(status, body, (time.perf_counter() - started) * 1000)


def client(connections: int) -> aiohttp.ClientSession:
    """A session of `connections` kept-alive connections of its own."""
    connector = aiohttp.TCPConnector(limit=connections, force_close=False)
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


@dataclasses.dataclass
class Tally:
    """Answers counted: successes, the rest by status, refusals by data.limit."""

    sent: int = 0
    succeeded: int = 0
    statuses: Counter[int] = dataclasses.field(default_factory=Counter)
    limits: Counter[str] = dataclasses.field(default_factory=Counter)
    samples: list[str] = dataclasses.field(default_factory=list)
    keep_refusals: bool = False  # whether refusals' bodies are among the samples too (B's)
    first_refusals: dict[str, str] = dataclasses.field(default_factory=dict)  # by status, limit

    @property
    def answered(self) -> int:
        return self.succeeded + sum(self.statuses.values())

    def add(self, answer: Answer) -> None:
        if answer.ok:
            self.succeeded += 1
            return
        self.statuses[answer.status] += 1
        refused = answer.status in REFUSED
        if refused:
            self.limits[answer.limit or "(no data.limit)"] += 1
            shown = answer.body[:400].decode(errors="replace")
            self.first_refusals.setdefault(f"{answer.status} {answer.limit or '-'}", shown)
        if (self.keep_refusals or not refused) and len(self.samples) < SAMPLES:
            self.samples.append(f"{answer.status}: {answer.body[:300].decode(errors='replace')}")

    def merge(self, other: Tally) -> None:
        self.sent += other.sent
        self.succeeded += other.succeeded
        self.statuses.update(other.statuses)
        self.limits.update(other.limits)
        self.samples.extend(other.samples[: max(0, SAMPLES - len(self.samples))])
        self.first_refusals = other.first_refusals | self.first_refusals

    def as_dict(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "answered": self.answered,
            "succeeded": self.succeeded,
            "refused_by_status": {str(s): self.statuses[s] for s in REFUSED if self.statuses[s]},
            "refused_by_limit": dict(self.limits.most_common()),
            "other_failures_by_status": {
                str(s): n for s, n in sorted(self.statuses.items()) if s not in REFUSED
            },
            "failure_samples": self.samples,
            "first_refusal_bodies": self.first_refusals,  # by "status data.limit"
        }


# --- B's paced closed loop ------------------------------------------------------------

Target = tuple[aiohttp.ClientSession, str, str, load.Request]  # session, url, kind, request


@dataclasses.dataclass(frozen=True)
class Sent:
    kind: str
    answer: Answer
    late: bool  # sent more than one interval after its time: the loop fell behind


async def paced(
    cycle: list[Target], first: float, interval: float, end: float, out: list[Sent]
) -> None:
    """One connection's requests from `cycle` in turn, each at its time (at once when late),
    one in flight, until `end` (the event loop's clock)."""
    loop = asyncio.get_running_loop()
    n = 0
    while (due := first + n * interval) < end:
        ahead = due - loop.time()
        if ahead > 0:
            await asyncio.sleep(ahead)  # pacing: the next request's time, no event to wait on
        session, url, kind, request = cycle[n % len(cycle)]
        out.append(Sent(kind, await exchange(session, url, request), ahead < -interval))
        n += 1


def _percentile(ordered: list[float], share: float) -> float:
    """Nearest rank of `share` in `ordered` (ascending)."""
    if not ordered:
        return 0.0
    return round(ordered[max(0, min(len(ordered) - 1, math.ceil(share * len(ordered)) - 1))], 3)


def _latencies(sent: list[Sent]) -> dict[str, Any]:
    ordered = sorted(s.answer.ms for s in sent)
    succeeded = sum(s.answer.ok for s in sent)
    return {
        "requests": len(sent),
        "succeeded": succeeded,
        "success_ratio": round(succeeded / len(sent), 6) if sent else 0.0,
        "p50_ms": _percentile(ordered, 0.50),
        "p99_ms": _percentile(ordered, 0.99),
        "max_ms": round(ordered[-1], 3) if ordered else 0.0,
    }


def summary(sent: list[Sent], elapsed: float) -> dict[str, Any]:
    """B's requests of a phase: counts, latencies (every answer's, from its send), failures."""
    failures = Tally(keep_refusals=True)
    for one in sent:
        failures.sent += 1
        failures.add(one.answer)
    found = _latencies(sent)
    found["requests_per_s"] = round(len(sent) / elapsed, 1)
    found["late"] = sum(s.late for s in sent)
    kinds = sorted({s.kind for s in sent})
    found["by_kind"] = {k: _latencies([s for s in sent if s.kind == k]) for k in kinds}
    found["failures"] = failures.as_dict()
    return found


# --- the flood --------------------------------------------------------------------------


def requests(token: str, task_id: str) -> dict[str, load.Request]:
    def call(tool: str, arguments: dict[str, Any]) -> load.Request:
        params = {"name": tool, "arguments": arguments}
        return load.Request("tools/call", params, name=tool, token=token)

    return {
        "rate": call("echo", {}),
        "slow": call("slow", {"ms": SLOW_MS}),
        "create": call("make_task", {}),
        "poll": load.Request("tasks/get", {"taskId": task_id}, name=task_id, token=token),
    }


async def _hammer(
    session: aiohttp.ClientSession, url: str, request: load.Request, tally: Tally, until: float
) -> None:
    while time.monotonic() < until:
        tally.sent += 1
        tally.add(await exchange(session, url, request))


async def flood(urls: list[str], token: str, task_id: str, deadline_s: float) -> dict[str, Any]:
    """Every kind against every instance until SIGTERM or `deadline_s`; the counts."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    until = time.monotonic() + deadline_s
    tallies = {kind: Tally() for kind in FLOOD}
    sessions, workers = [], []
    for kind, request in requests(token, task_id).items():
        per_instance = FLOOD[kind] // len(urls)
        for url in urls:
            session = client(per_instance)
            sessions.append(session)
            for _ in range(per_instance):
                work = _hammer(session, url, request, tallies[kind], until)
                workers.append(asyncio.ensure_future(work))
    started = time.monotonic()
    try:
        # Polled, bounded by the deadline: a worker ends only there, or by an error here.
        while not all(t.answered for t in tallies.values()) and not stop.is_set():
            done, _ = await asyncio.wait(workers, timeout=0.05)
            if done:
                break
        print(READY, flush=True)
        waiting = asyncio.ensure_future(stop.wait())
        await asyncio.wait([waiting, *workers], timeout=max(0.0, until - time.monotonic()),
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        waiting.cancel()
    finally:
        seconds = time.monotonic() - started
        for worker in workers:
            worker.cancel()
        ended = await asyncio.gather(*workers, return_exceptions=True)
        for session in sessions:
            await session.close()
    broken = [e for e in ended if isinstance(e, Exception)]
    if broken:  # a fault of this module: not to be reported as a flood
        raise broken[0]
    return _counts(tallies, seconds, len(urls))


def _counts(tallies: dict[str, Tally], seconds: float, instances: int) -> dict[str, Any]:
    total = Tally()
    for tally in tallies.values():
        total.merge(tally)
    kinds = {kind: tally.as_dict() for kind, tally in tallies.items()}
    for kind, found in kinds.items():
        found["connections"] = FLOOD[kind] // instances * instances
        found["sent_per_s"] = round(found["sent"] / seconds, 1) if seconds else 0.0
    return {"seconds": round(seconds, 2), "kinds": kinds, "all": total.as_dict()}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--urls", required=True, help="taskgate URLs, comma-separated")
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--task", required=True, help="a task of A's, for the polling flood")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline-s", type=float, default=DEADLINE_S)
    args = parser.parse_args()
    urls = [url for url in args.urls.split(",") if url]
    token = args.token_file.read_text().strip()
    found = asyncio.run(flood(urls, token, args.task, min(args.deadline_s, DEADLINE_S)))
    args.out.write_text(json.dumps(found, indent=2) + "\n")


if __name__ == "__main__":
    main()
