"""FrontDoor: the 2025-era parts one process shares (gateway/pipeline/legacy.py serves them)."""

from __future__ import annotations

from gateway.config import LegacyConfig
from gateway.legacy.sessions import Sessions
from gateway.legacy.stream import Streams
from gateway.legacy.upstreams import Upstreams
from gateway.limits.limiter import Limiter
from gateway.store.sessions import SessionStore
from gateway.upstream.pool import Pool


class FrontDoor:
    """The 2025-era parts one process shares: sessions, upstream sessions, GET streams."""

    def __init__(
        self, config: LegacyConfig, store: SessionStore, pool: Pool, limits: Limiter
    ) -> None:
        self.config = config
        self.sessions = Sessions(store, config, limits)
        self.upstreams = Upstreams(pool, self.sessions, config)
        self.streams = Streams(config, pool, limits)
        self.upstreams.on_bound = self.streams.joined

    def reconfigure(self, config: LegacyConfig) -> None:
        self.config = config
        self.sessions.reconfigure(config)
        self.upstreams.reconfigure(config)
        self.streams.reconfigure(config)

    async def close(self) -> None:
        await self.streams.close()
        await self.upstreams.close()
