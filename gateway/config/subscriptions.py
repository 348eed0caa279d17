"""The `subscriptions` section: subscriptions/listen streams."""

from __future__ import annotations

from pydantic import Field

from gateway.config.section import Section


class SubscriptionsConfig(Section):
    """subscriptions/listen: how many streams, what one may watch, and the pace of what taskgate
    emulates for backends that cannot push."""

    max_streams: int = Field(
        5000, ge=0, description="Listen streams one process holds at once; more get 503."
    )
    max_streams_per_principal: int | None = Field(
        None,
        ge=1,
        description="Deprecated: limits.principal.listen_streams, which takes precedence.",
    )
    max_task_ids: int = Field(100, ge=0, le=10_000, description="taskIds in one listen.")
    max_resource_uris: int = Field(
        100, ge=0, le=10_000, description="resourceSubscriptions in one listen."
    )
    max_pollers: int = Field(
        10_000, ge=1, description="Tasks one process polls at once, shared by every stream."
    )
    keepalive_s: float = Field(
        15.0, gt=0, le=3600, description="An SSE comment on a stream idle this long."
    )
    default_poll_interval_ms: int = Field(
        2000, ge=10, description="How often a task is polled when it names no pollIntervalMs."
    )
    min_poll_interval_ms: int = Field(
        250,
        ge=10,
        description="The fastest taskgate polls a task, whatever its pollIntervalMs asks.",
    )
    list_poll_s: float | None = Field(
        None,
        gt=0,
        le=3600,
        description="How often the catalogue is compared for list_changed while a stream asks "
        "for it; by default discovery.refresh_s.",
    )
    ack_timeout_s: float = Field(
        5.0,
        gt=0,
        le=60,
        description="How long a listen waits for the upstream listens of its resourceSubscriptions "
        "to be acknowledged; a backend silent that long honours none of its URIs.",
    )
    max_pending_bytes: int = Field(
        256 * 1024 * 1024,
        ge=65_536,
        description="Event bytes all listen streams of a process owe their clients together; "
        "past it the stream owing the most is cut (its client listens again).",
    )
