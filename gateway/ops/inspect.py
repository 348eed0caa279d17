"""Inspection for the operator: `taskgate routes` prints the compiled route table, one row per
item, and what never wins. (`taskgate task inspect`: gateway/ops/inspect_task.py.)"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import UTC, datetime
from typing import NamedTuple

from gateway.catalog.collisions import collisions
from gateway.catalog.table import RouteTable
from gateway.config import ROUTE_KINDS, Config

_COLUMNS = ("route", "kind", "pattern", "backend", "tenants", "scopes")


# --- taskgate routes ----------------------------------------------------------------------


def routes_command(config: Config, args: argparse.Namespace) -> int:
    """The route table, the items it shadows, and with --discover what the backends' lists add;
    exit 1 when a backend did not answer discovery, as `check --discover` does."""
    served: list[str] | None = None
    silent: list[str] = []
    eras: list[str] = []
    if args.discover:
        served, silent, eras = asyncio.run(discovered(config))
    if not emit(routes_text(config, served, silent, eras)):
        return 0
    for name in silent:
        print(f"taskgate: warning: backend {name!r} did not answer discovery", file=sys.stderr)
    return 1 if silent else 0


def routes_text(
    config: Config,
    served: list[str] | None = None,
    silent: list[str] | None = None,
    eras: list[str] | None = None,
) -> str:
    """The compiled table in aligned columns (YAML order, which is precedence, then kind), then
    the configuration's shadowed and overlapping items and, given, the backends' findings
    (`silent`: the backends that did not answer, whose items they leave out; `eras`: what each
    replica speaks)."""
    rows: list[tuple[str, ...]] = [_COLUMNS]
    for route in RouteTable(config.routes).routes:
        tenants = "all" if route.tenants is None else ",".join(sorted(route.tenants)) or "none"
        scopes = ",".join(route.scopes) or "-"
        for kind in ROUTE_KINDS:
            for pattern in getattr(route, kind):
                rows.append((str(route.index), kind, pattern, route.backend, tenants, scopes))
    lines = _aligned(rows)
    lines += ["", "shadowed or overlapping, by the configuration:"]
    lines += [f"  {finding}" for finding in collisions(config.routes)] or ["  none"]
    if served is not None:
        lines.append("shadowed or served twice, by what the backends serve:")
        lines += [f"  {finding}" for finding in served] or ["  none"]
        lines += [
            f"  (backend {name!r} did not answer: its items are not here)" for name in silent or ()
        ]
    if eras:
        lines.append("what each replica speaks:")
        lines += [f"  {line}" for line in eras]
    return "\n".join(lines)


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


class Discovered(NamedTuple):
    """What one look at the backends found."""

    warnings: list[str]  # gateway/catalog/served.py's
    silent: list[str]  # the routed backends that did not answer
    eras: list[str]  # each replica's era: "backend  host:port  2026-07-28"


async def discovered(config: Config) -> Discovered:
    """One look at every routed backend, as a starting taskgate takes it (and at the era of
    every replica): the warnings of gateway/catalog/served.py, the backends that did not
    answer, and what each replica speaks."""
    from gateway.catalog.discovery import Catalog
    from gateway.errors import Retryable
    from gateway.pipeline.parts import relay_pool
    from gateway.upstream.replicas import Backend

    backends = {name: Backend.from_config(name, b) for name, b in config.backends.items()}
    table = RouteTable(config.routes)
    pool = relay_pool(config)  # the head limits and answer bounds a starting taskgate has
    catalog = Catalog(pool, backends, table, refresh_s=config.discovery.refresh_s, report=False)
    try:
        try:
            views = await catalog.views()
        except Retryable:
            views = {}
        await catalog.eras.learn_all()
        eras = _aligned(
            [
                (name, replica.label, catalog.eras.described(backend, replica))
                for name, backend in backends.items()
                for replica in backend.replicas
            ]
        )
    finally:
        await catalog.close()
        await pool.close()
    silent = [name for name in table.backends() if name not in views]
    return Discovered(catalog.warnings(), silent, eras)


# --- shared -------------------------------------------------------------------------------


def utc(ms: int) -> str:
    """Milliseconds since the epoch as UTC ISO 8601 text, as the JSON request log writes time."""
    when = datetime.fromtimestamp(ms / 1000, UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def span(ms: int) -> str:
    """A duration in its two largest units: "3 h 12 min", "2 d", "45 s", "850 ms"."""
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms // 1000
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    units = [(days, "d"), (hours, "h"), (minutes, "min"), (seconds, "s")]
    first = next(i for i, (value, _) in enumerate(units) if value)
    shown = [units[first]] + [u for u in units[first + 1 : first + 2] if u[0]]
    return " ".join(f"{value} {unit}" for value, unit in shown)


def emit(text: str) -> bool:
    """Print `text`; False when the reader has gone (`taskgate routes | head`), quietly."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail
        os.close(devnull)
        return False
    return True
