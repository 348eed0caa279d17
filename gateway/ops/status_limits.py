"""The status page's limits section: who is near a limit, and who met one lately.

"Near" is what this process can see at once: a tenant holding 80% or more of the requests in
flight it may hold here (its share of listen.max_in_flight, or its own limits.tenant.concurrent).
A bucket in Redis is not read for the page: the refusals of the last minutes say who met a rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.pipeline.state import Gateway

NEAR = 0.8  # a share of a limit that counts as near it
SHOWN = 20  # rows of each table, at most


@dataclass(frozen=True, slots=True)
class LimitsStatus:
    near: tuple[tuple[str, int, int], ...]  # (tenant, requests in flight, limit), fullest first
    refused: tuple[tuple[str, str, float], ...]  # (tenant, limit name, when), newest first


def limits_status(gateway: Gateway) -> LimitsStatus:
    coordinator = gateway.coordinator
    near = []
    for tenant, held in coordinator.per_tenant().items():
        limit = coordinator.tenant_limit(tenant)
        if held >= NEAR * limit:
            near.append((tenant, held, limit))
    near.sort(key=lambda row: row[1] / row[2], reverse=True)
    refused = [(tenant, name, at) for tenant, (name, at) in gateway.limits.recent.items()]
    refused.reverse()
    return LimitsStatus(tuple(near[:SHOWN]), tuple(refused[:SHOWN]))
