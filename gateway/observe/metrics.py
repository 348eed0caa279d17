"""The counts taskgate keeps per request, as plain Python numbers.

Recording one request is a dictionary increment and a bisect: prometheus-client's own metric
objects take a lock per update (and in its multiprocess mode write a memory-mapped file), which
on `tasks/get` cost more than the 5% the hot path may spend on metrics. The client library
renders these numbers at scrape time instead (gateway/ops/exposition.py).
"""

from __future__ import annotations

from bisect import bisect_left

# Seconds; a request through taskgate takes ~0.2 ms on loopback, a tool call up to minutes.
REQUEST_BUCKETS = (
    0.0002,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
STORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.0)

# JSON-RPC error codes as a bounded label: the code's class, never the message.
_CODE_CLASSES = {
    -32700: "parse_error",
    -32600: "invalid_request",
    -32601: "method_not_found",
    -32602: "invalid_params",
    -32603: "internal_error",
}


def code_class(code: int | None) -> str:
    """`ok` without an error; the JSON-RPC name of a standard code; `server_error` for the
    implementation range (-32000..-32099, taskgate's own -32020/-32021 included); else
    `application`."""
    if code is None:
        return "ok"
    named = _CODE_CLASSES.get(code)
    if named is not None:
        return named
    if -32099 <= code <= -32000:
        return "server_error"
    return "application"


class Histogram:
    """Counts per bucket (the last one past every bound) and their sum; cumulative only when
    rendered."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class RequestMetrics:
    """What each request adds: its outcome, its duration, its upstream call's duration; and
    each store operation's duration. Labels are bounded by construction: a method from
    gateway/protocol/methods.py (anything else is `other`), a configured backend name, an HTTP
    status, a code class."""

    __slots__ = ("durations", "requests", "store", "upstream")

    def __init__(self) -> None:
        # (method, HTTP status, code class, backend) -> requests
        self.requests: dict[tuple[str, int, str, str], int] = {}
        self.durations: dict[str, Histogram] = {}  # by method
        self.upstream: dict[str, Histogram] = {}  # by backend
        self.store: dict[str, Histogram] = {}  # by store operation

    def request(self, method: str, status: int, code: str, backend: str, seconds: float) -> None:
        key = (method, status, code, backend)
        requests = self.requests
        requests[key] = requests.get(key, 0) + 1
        histogram = self.durations.get(method)
        if histogram is None:
            histogram = self.durations[method] = Histogram(REQUEST_BUCKETS)
        histogram.observe(seconds)

    def upstream_call(self, backend: str, seconds: float) -> None:
        histogram = self.upstream.get(backend)
        if histogram is None:
            histogram = self.upstream[backend] = Histogram(REQUEST_BUCKETS)
        histogram.observe(seconds)

    def store_operation(self, operation: str, seconds: float) -> None:
        histogram = self.store.get(operation)
        if histogram is None:
            histogram = self.store[operation] = Histogram(STORE_BUCKETS)
        histogram.observe(seconds)
