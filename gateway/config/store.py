"""The `store` and `tasks` sections: where task routes live, and how long."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from gateway.config.section import Section
from gateway.store.redis_url import TLS_SCHEMES, StoreURLError, parse_redis_url, scheme_of


class StoreTLSConfig(Section):
    """PEM files for TLS to Redis (rediss://, rediss+sentinel://, rediss+cluster://); relative
    paths name files beside the configuration file. The server's certificate is always
    verified, its host name included."""

    ca_file: str | None = Field(
        None,
        min_length=1,
        description="The CA that signed the servers' certificates; unset: the system's CAs.",
    )
    cert_file: str | None = Field(
        None,
        min_length=1,
        description="A client certificate, for servers that ask for one (tls-auth-clients).",
    )
    key_file: str | None = Field(
        None, min_length=1, description="The client certificate's private key (unencrypted)."
    )

    @model_validator(mode="after")
    def _key_with_its_certificate(self) -> StoreTLSConfig:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("key_file is the key of cert_file: give cert_file too")
        return self


class StoreConfig(Section):
    """Where task routes live: SQLite for one node, Redis (one server, Sentinel, Cluster) for
    several."""

    url: str = Field(
        "sqlite:///./taskgate-routes.db",
        description="sqlite:///relative.db (beside the configuration file), "
        "sqlite:////absolute.db, redis://[:password@]host:port/db, rediss://... (TLS), "
        "redis+sentinel://[:password@]host:port[,host:port...]/service[/db], "
        "redis+cluster://[:password@]host:port[,host:port...] (seed nodes); "
        "rediss+sentinel:// and rediss+cluster:// for TLS to every node",
    )
    tls: StoreTLSConfig | None = Field(
        None,
        description="Files for TLS; only with rediss://, rediss+sentinel://, rediss+cluster://.",
    )
    timeout_s: float = Field(2.0, gt=0, le=60, description="Deadline of one store operation.")
    cache_size: int = Field(
        10_000, ge=0, description="Found routes kept in process memory (0 turns the cache off)."
    )
    durability: Literal["none", "wait_aof", "wait_replicas"] = Field(
        "none",
        description="Redis only: after recording a route, wait for the local AOF fsync "
        "(WAITAOF, Redis >= 7.2) or for `wait_replicas` replicas (WAIT) before relaying it; "
        "on a cluster, the replicas of the master that holds the route.",
    )
    wait_replicas: int | None = Field(
        None,
        ge=0,
        le=16,
        description="Replicas that must acknowledge (wait_replicas, default 1) or fsync "
        "(wait_aof, default 0) each route.",
    )
    wait_timeout_ms: int = Field(500, ge=1, le=60_000)
    max_connections: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="Redis only: taskgate's connections to the store per process (of a cluster, "
        "to each node); an operation finding all in use waits for one, at most timeout_s. "
        "By default listen.max_in_flight + 16, at most 256.",
    )

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if scheme_of(url) == "sqlite":
            if not sqlite_path(url):
                raise ValueError(
                    "a sqlite URL names a file: sqlite:///relative.db or sqlite:////abs.db"
                )
            return url
        try:
            parse_redis_url(url)
        except StoreURLError as exc:
            raise ValueError(f"{exc}; or use sqlite:///routes.db") from None
        return url

    @property
    def replicas_to_wait_for(self) -> int:
        if self.durability == "none":
            return 0
        default = 1 if self.durability == "wait_replicas" else 0
        return default if self.wait_replicas is None else self.wait_replicas

    @model_validator(mode="after")
    def _durability_needs_redis(self) -> StoreConfig:
        if self.durability != "none" and self.url.startswith("sqlite:"):
            raise ValueError("durability applies to Redis; SQLite always syncs (synchronous=FULL)")
        if self.max_connections is not None and self.url.startswith("sqlite:"):
            raise ValueError("max_connections applies to Redis; SQLite uses one connection")
        return self

    @model_validator(mode="after")
    def _tls_needs_a_tls_url(self) -> StoreConfig:
        if self.tls is not None and scheme_of(self.url) not in TLS_SCHEMES:
            raise ValueError(
                "tls applies to rediss://, rediss+sentinel:// and rediss+cluster:// URLs; "
                f"this one is {scheme_of(self.url)}://"
            )
        return self


def sqlite_path(url: str) -> str:
    """The file of a sqlite:/// URL: sqlite:///./a.db is ./a.db, sqlite:////tmp/a.db /tmp/a.db."""
    return urlsplit(url).path[1:]


class MadeTasksConfig(Section):
    """The tasks taskgate runs itself (a route's `task.mode`): leases and bounds."""

    lease_s: float = Field(
        15.0,
        ge=1,
        le=600,
        description="How long a running task's lease lasts; its holder renews it every third "
        "of this. A task whose holder stopped fails within it.",
    )
    max_running: int = Field(
        256, ge=1, le=100_000, description="Tasks this process runs at once; more are refused."
    )
    max_running_per_principal: int = Field(
        32, ge=1, le=100_000, description="Tasks this process runs at once for one principal."
    )
    max_per_principal: int = Field(
        100,
        ge=1,
        le=1_000_000,
        description="Records one principal may have in the store, running or ended, until "
        "their ttl: with max_result_bytes, what one principal can keep there.",
    )
    max_total: int = Field(
        10_000,
        ge=1,
        le=10_000_000,
        description="Records in the store across principals (every instance counts the same).",
    )
    watch_interval_ms: int = Field(
        500,
        ge=50,
        le=60_000,
        description="How often a listen stream's watch reads a task another instance holds "
        "(one this instance holds is read as soon as it changes).",
    )
    input_poll_ms: int = Field(
        250,
        ge=10,
        le=10_000,
        description="How often a holder reads the answers to a waiting task's questions.",
    )


class TasksConfig(Section):
    """How long task routes live; the tasks taskgate runs itself."""

    grace_s: float = Field(
        60.0, ge=0, description="A route outlives its task's createdAt + ttlMs by this much."
    )
    unlimited_ttl_cap_s: float = Field(
        7 * 24 * 3600.0, gt=0, description="Lifetime of the route of a task with ttlMs: null."
    )
    record_timeout_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description="Longest wait for a route to be recorded before failing closed.",
    )
    made: MadeTasksConfig = MadeTasksConfig()
