"""The Accept rule of a POST: a 2026-07-28 client must take both JSON and an event stream."""

from __future__ import annotations

from collections.abc import Sequence

JSON = "application/json"
EVENT_STREAM = "text/event-stream"

# Each media range that matches one of the two types, with how specific the match is:
# RFC 9110 12.5.1, the most specific range that matches a type decides its weight.
_MATCHES: dict[str, tuple[tuple[str, int], ...]] = {
    JSON: ((JSON, 2),),
    "application/*": ((JSON, 1),),
    EVENT_STREAM: ((EVENT_STREAM, 2),),
    "text/*": ((EVENT_STREAM, 1),),
    "*/*": ((JSON, 0), (EVENT_STREAM, 0)),
}


def admits(value: str) -> bool:
    """Whether an Accept field value admits both application/json and text/event-stream.

    Wildcards admit (`*/*`, `application/*`, `text/*`); `q=0` excludes, and a more specific
    range overrides a wildcard (`text/event-stream;q=0, */*` does not admit an event stream).
    Media types are case-insensitive; parameters other than q are ignored, and so is a weight
    that is not a number from 0 to 1 (the backends ignore every weight). An empty value admits
    nothing. Quoted parameter values are not parsed: the value is split at every comma, as the
    backends (the MCP SDK) split it, so both read the same media ranges.
    """
    json_rank, json_q = -1, 0.0
    sse_rank, sse_q = -1, 0.0
    for element in value.split(","):
        media_range, _, parameters = element.partition(";")
        matches = _MATCHES.get(media_range.strip().lower())
        if matches is None:
            continue
        q = _weight(parameters) if parameters else 1.0
        for media_type, rank in matches:
            if media_type == JSON:
                if rank > json_rank or (rank == json_rank and q > json_q):
                    json_rank, json_q = rank, q
            elif rank > sse_rank or (rank == sse_rank and q > sse_q):
                sse_rank, sse_q = rank, q
    return json_q > 0 and sse_q > 0


def _weight(parameters: str) -> float:
    for parameter in parameters.split(";"):
        name, _, raw = parameter.partition("=")
        if name.strip().lower() == "q":
            try:
                q = float(raw.strip())
            except ValueError:
                return 1.0
            return q if 0.0 <= q <= 1.0 else 1.0  # NaN fails both comparisons
    return 1.0


def acceptable(values: Sequence[str]) -> bool:
    """`admits` for a request's Accept lines as received (several combine as one list, RFC 9110
    5.3). A request carries one of a few values, so each verdict is remembered; the bound keeps
    odd clients from growing the memo."""
    value = values[0] if len(values) == 1 else ", ".join(values)
    verdict = _verdicts.get(value)
    if verdict is None:
        verdict = admits(value)
        if len(_verdicts) < _VERDICTS_MEMO:
            _verdicts[value] = verdict
    return verdict


_verdicts: dict[str, bool] = {}
_VERDICTS_MEMO = 256
