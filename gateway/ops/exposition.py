"""GET /metrics: the Prometheus text format, rendered by prometheus-client at scrape time.

A scrape reads numbers the parts of taskgate keep anyway (the coordinator's in-flight table,
replica health, the listen hub, the route cache) and the counts each request adds
(gateway/observe/metrics.py), into a `snapshot`: plain JSON-able data. With `--workers N` every
worker writes its snapshot to a shared folder each second and the first worker's scrape adds
them up (gateway/observe/board.py), so one scrape sees the whole instance.

Labels are bounded: a method from the method table, a configured backend name and its
replicas' host:port, an HTTP status, a JSON-RPC code class, a store operation, a limit's name,
a tenant only by its name in limits.tenants (every other tenant is "default"); never a task id,
a principal, another tenant or a name a client sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway.auth.authenticator import JWTAuthenticator
from gateway.auth.jwks import JWKSource
from gateway.observe.logs import dropped_lines
from gateway.observe.metrics import REQUEST_BUCKETS, STORE_BUCKETS, Histogram
from gateway.pipeline.state import GATEWAY, Gateway

# name -> [[label values..., value]]; a histogram's value is [bucket counts..., sum]
Snapshot = dict[str, list[list[Any]]]


@dataclass(frozen=True, slots=True)
class Spec:
    kind: str  # counter, gauge, histogram
    help: str
    labels: tuple[str, ...] = ()
    merge: str = "sum"  # how workers' values add up: sum, or min (healthy only if all agree)
    buckets: tuple[float, ...] = ()


SPECS: dict[str, Spec] = {
    "taskgate_requests": Spec(
        "counter",
        "Requests answered, by JSON-RPC method (or HTTP method off the MCP path), HTTP status, "
        "JSON-RPC error code class (ok without an error) and the backend that answered.",
        ("method", "status", "rpc_code", "backend"),
    ),
    "taskgate_request_duration_seconds": Spec(
        "histogram",
        "Whole requests, from the head read to the answer ready, by method.",
        ("method",),
        buckets=REQUEST_BUCKETS,
    ),
    "taskgate_upstream_duration_seconds": Spec(
        "histogram",
        "Upstream calls to a replica, to its whole answer (JSON) or its stream's start (SSE).",
        ("backend",),
        buckets=REQUEST_BUCKETS,
    ),
    "taskgate_store_duration_seconds": Spec(
        "histogram",
        "Task-route store operations: record, lookup, refresh_expiry.",
        ("operation",),
        buckets=STORE_BUCKETS,
    ),
    "taskgate_requests_in_flight": Spec("gauge", "Requests being served now."),
    "taskgate_backend_requests_in_flight": Spec(
        "gauge", "Requests being served now, by the backend they were routed to.", ("backend",)
    ),
    "taskgate_task_routes": Spec(
        "counter",
        "Task routes recorded, found and not found by task methods, refused (conflict: the id "
        "was owned already; store_down: the store did not answer), and expired (found in "
        "process memory past their expiry).",
        ("outcome",),
    ),
    "taskgate_route_cache_entries": Spec("gauge", "Task routes held in process memory."),
    "taskgate_listen_streams": Spec("gauge", "subscriptions/listen streams open."),
    "taskgate_legacy_streams": Spec("gauge", "GET streams of 2025-era sessions open."),
    "taskgate_legacy_sessions": Spec(
        "counter",
        "2025-era sessions by event: opened, evicted (the caller's least recently used, at "
        "max_sessions_per_principal), ended (DELETE), lost (an upstream session was gone).",
        ("event",),
    ),
    "taskgate_listen_pollers": Spec("gauge", "Tasks polled for listen streams."),
    "taskgate_bridge_sessions": Spec(
        "gauge",
        "Callers' sessions open on a replica of the 2025 era (docs/backends-2025.md).",
        ("backend", "replica"),
    ),
    "taskgate_bridge_sessions_opened": Spec(
        "counter", "Callers' sessions opened on replicas of the 2025 era."
    ),
    "taskgate_bridge_waiting_calls": Spec(
        "gauge", "Calls of 2025-era servers held open while their clients answer a question."
    ),
    "taskgate_bridge_task_readers": Spec(
        "gauge", "tasks/result streams read for the questions of 2025-era tasks."
    ),
    "taskgate_made_tasks": Spec(
        "counter",
        "Tasks taskgate runs itself (docs/tasks.md): created, inline (offer: answered in time), "
        "refused (over a bound), store_down (not recorded); found and not_found by task "
        "methods; and how those this process held ended: completed, failed, cancelled, lost "
        "(no longer its own: expired, or failed elsewhere after its lease lapsed), stopped "
        "(failed at the end of a drain).",
        ("outcome",),
    ),
    "taskgate_made_tasks_running": Spec(
        "gauge", "Tasks taskgate runs whose calls this process holds, under a lease."
    ),
    "taskgate_made_tasks_waiting": Spec(
        "gauge", "Of those, the tasks waiting for their clients' answers (input_required)."
    ),
    "taskgate_made_result_bytes": Spec(
        "counter", "Bytes of final answers this process wrote to the store for its tasks."
    ),
    "taskgate_made_task_watches": Spec(
        "gauge", "Tasks taskgate runs that listen streams of this process watch."
    ),
    "taskgate_limit_refusals": Spec(
        "counter",
        "Requests refused by a limit of the limits section (429; docs/limits.md), by the limit's "
        "name (tenant.rate_per_s, principal.concurrent, polling, ...) and the tenant: its name "
        "in limits.tenants, or default for every tenant it does not name.",
        ("limit", "tenant"),
    ),
    "taskgate_limit_store_errors": Spec(
        "counter",
        "Limit checks the store did not answer: rate limits passed them, task quotas refused.",
    ),
    "taskgate_polling_snapshots": Spec(
        "gauge", "Last tasks/get answers kept for limits.polling (at most max_snapshots)."
    ),
    "taskgate_replica_healthy": Spec(
        "gauge",
        "1 when the replica takes new calls, 0 while it is ejected (with workers: 1 only when "
        "every worker takes it).",
        ("backend", "replica"),
        merge="min",
    ),
    "taskgate_replica_ejections": Spec(
        "counter", "Times a replica was ejected after consecutive failures.", ("backend", "replica")
    ),
    "taskgate_token_cache": Spec(
        "counter",
        "Bearer tokens served from the verified-token memory (hit) or verified anew (miss).",
        ("result",),
    ),
    "taskgate_jwks_refreshes": Spec(
        "counter", "Fetches of the JWKS URL, by result (ok, failed).", ("result",)
    ),
    "taskgate_config_reloads": Spec(
        "counter", "Configuration reloads, by result (applied, refused).", ("result",)
    ),
    "taskgate_config_info": Spec(
        "gauge", "1, labelled with the running configuration's version.", ("version",), "min"
    ),
    "taskgate_workers": Spec("gauge", "Worker processes whose numbers this scrape adds up."),
    "taskgate_log_lines_dropped": Spec(
        "counter",
        "Log lines (request log and taskgate's own) dropped because standard error was not read "
        "fast enough and logging.max_pending_bytes were waiting.",
    ),
}


def snapshot(gateway: Gateway) -> Snapshot:
    """This process's numbers, as plain data."""
    metrics, coordinator, tasks = gateway.observer.metrics, gateway.coordinator, gateway.tasks
    data: Snapshot = {
        "taskgate_requests": [[*key, count] for key, count in metrics.requests.items()],
        "taskgate_request_duration_seconds": _histograms(metrics.durations),
        "taskgate_upstream_duration_seconds": _histograms(metrics.upstream),
        "taskgate_store_duration_seconds": _histograms(tasks.store_times),
        "taskgate_requests_in_flight": [[coordinator.in_flight]],
        "taskgate_backend_requests_in_flight": [
            [name, coordinator.per_backend().get(name, 0)] for name in gateway.backends
        ],
        "taskgate_task_routes": [
            *([outcome, count] for outcome, count in tasks.outcomes.items()),
            ["expired", tasks.cache.expired],
        ],
        "taskgate_route_cache_entries": [[len(tasks.cache)]],
        "taskgate_listen_streams": [[gateway.listens.streams]],
        "taskgate_listen_pollers": [[gateway.listens.pollers]],
        "taskgate_legacy_streams": [[gateway.legacy.streams.open if gateway.legacy else 0]],
        "taskgate_legacy_sessions": [
            [event, count]
            for event, count in (gateway.legacy.sessions.events if gateway.legacy else {}).items()
        ],
        "taskgate_bridge_sessions": [
            [name, replica.label, gateway.callers.count(replica)]
            for name, backend in gateway.backends.items()
            for replica in backend.replicas
            if gateway.callers.count(replica)
        ],
        "taskgate_bridge_sessions_opened": [[gateway.callers.opened]],
        "taskgate_bridge_waiting_calls": [[gateway.callers.waiting.count()]],
        "taskgate_bridge_task_readers": [
            [tasks.task_input.readers if tasks.task_input is not None else 0]
        ],
        **_made(gateway),
        **_limits(gateway),
        "taskgate_replica_healthy": [
            [name, replica.label, 1 if gateway.health.healthy(replica) else 0]
            for name, backend in gateway.backends.items()
            for replica in backend.replicas
        ],
        "taskgate_replica_ejections": [
            [backend, replica, count]
            for (backend, replica), count in gateway.health.ejections.items()
        ],
        "taskgate_config_reloads": [
            ["applied", sum(1 for r in gateway.history.reloads if r.applied)],
            ["refused", sum(1 for r in gateway.history.reloads if not r.applied)],
        ],
        "taskgate_config_info": [[gateway.history.version, 1]],
        "taskgate_workers": [[1]],
        "taskgate_log_lines_dropped": [[dropped_lines()]],
    }
    auth = gateway.auth
    if isinstance(auth, JWTAuthenticator):
        data["taskgate_token_cache"] = [["hit", auth.cache_hits], ["miss", auth.cache_misses]]
        if isinstance(auth.keys, JWKSource):
            data["taskgate_jwks_refreshes"] = [[k, v] for k, v in auth.keys.refreshes.items()]
    return data


def _made(gateway: Gateway) -> Snapshot:
    """The numbers of the tasks taskgate runs itself."""
    holder = gateway.made.holder
    return {
        "taskgate_made_tasks": [
            [outcome, count]
            for counts in (gateway.made.outcomes, holder.outcomes)
            for outcome, count in counts.items()
        ],
        "taskgate_made_tasks_running": [[len(holder.held)]],
        "taskgate_made_tasks_waiting": [[holder.waiting]],
        "taskgate_made_result_bytes": [[holder.result_bytes]],
        "taskgate_made_task_watches": [[len(gateway.listens.made_watches)]],
    }


def _limits(gateway: Gateway) -> Snapshot:
    """The numbers of the limits section."""
    limits = gateway.limits
    return {
        "taskgate_limit_refusals": [
            [limit, tenant, count] for (limit, tenant), count in limits.refusals.items()
        ],
        "taskgate_limit_store_errors": [[limits.store_down]],
        "taskgate_polling_snapshots": [[len(limits.snapshots)]],
    }


def _histograms(histograms: dict[str, Histogram]) -> list[list[Any]]:
    return [[label, [*h.counts, h.sum]] for label, h in histograms.items()]


def merge(snapshots: Iterable[Snapshot]) -> Snapshot:
    """Several processes' numbers as one: counters, histograms and most gauges add up; a gauge
    whose Spec says min keeps the smallest."""
    merged: dict[str, dict[tuple[Any, ...], Any]] = {}
    for one in snapshots:
        for name, samples in one.items():
            spec = SPECS.get(name)
            if spec is None:
                continue  # written by a worker of another version
            into = merged.setdefault(name, {})
            width = len(spec.labels)
            for sample in samples:
                key = tuple(sample[:width])
                value = sample[width]
                before = into.get(key)
                if before is None:
                    into[key] = list(value) if spec.kind == "histogram" else value
                elif spec.kind == "histogram":
                    if len(before) == len(value):
                        into[key] = [a + b for a, b in zip(before, value, strict=True)]
                elif spec.merge == "min":
                    into[key] = min(before, value)
                else:
                    into[key] = before + value
    return {name: [[*key, value] for key, value in into.items()] for name, into in merged.items()}


class _Families(Collector):
    def __init__(self, data: Snapshot) -> None:
        self._data = data

    def collect(self) -> Iterator[Metric]:
        for name, spec in SPECS.items():
            samples = self._data.get(name)
            if samples is None:
                continue
            width = len(spec.labels)
            if spec.kind == "histogram":
                histogram = HistogramMetricFamily(name, spec.help, labels=spec.labels)
                for sample in samples:
                    *counts, total = sample[width]
                    cumulative = []
                    running = 0
                    for bound, count in zip((*spec.buckets, float("inf")), counts, strict=True):
                        running += count
                        cumulative.append((_le(bound), running))
                    histogram.add_metric([str(v) for v in sample[:width]], cumulative, total)
                yield histogram
            elif spec.kind == "counter":
                counter = CounterMetricFamily(name, spec.help, labels=spec.labels)
                for sample in samples:
                    counter.add_metric([str(v) for v in sample[:width]], sample[width])
                yield counter
            else:
                gauge = GaugeMetricFamily(name, spec.help, labels=spec.labels)
                for sample in samples:
                    gauge.add_metric([str(v) for v in sample[:width]], sample[width])
                yield gauge


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def render(data: Snapshot) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(data))
    return generate_latest(registry)


async def metrics(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    data = snapshot(gateway)
    board = gateway.board
    if board is not None:
        data = merge([data, *board.others()])
    return web.Response(body=render(data), headers={"Content-Type": CONTENT_TYPE_LATEST})
