"""store: in the YAML: every Redis form is accepted, a wrong URL is named without its password,
store.tls goes with TLS URLs only (durability and max_connections with Redis only) and its files
are found beside the configuration file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import ConfigError, load_config, parse_config

BACKENDS = {"reports": {"replicas": ["http://127.0.0.1:9101/mcp"]}}
ROUTES = [{"tools": ["*"], "backend": "reports"}]


def config_text(store: dict[str, Any]) -> str:
    return yaml.safe_dump({"store": store, "backends": BACKENDS, "routes": ROUTES})


@pytest.mark.parametrize(
    "url",
    [
        "redis://:pw@127.0.0.1:6379/0",
        "rediss://:pw@redis.internal:6380/0",
        "redis+sentinel://:pw@10.0.0.1:26379,10.0.0.2:26379/taskgate/1",
        "redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000",
        "rediss+cluster://:pw@10.0.0.1:7000",
    ],
)
def test_every_redis_form_is_accepted_with_durability(url: str) -> None:
    store = {"url": url, "durability": "wait_replicas", "wait_replicas": 1}
    assert parse_config(config_text(store)).store.url == url


def test_a_wrong_store_url_is_named_masked_with_what_is_wrong() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(config_text({"url": "redis+sentinel://:hunter2@10.0.0.1:26379"}))
    assert refused.value.problems == [
        "store.url: redis+sentinel://:***@10.0.0.1:26379: no service name: "
        "redis+sentinel://host:port/<service>[/db]; or use sqlite:///routes.db"
    ]


@pytest.mark.parametrize(
    ("store", "problem"),
    [
        (
            {"url": "redis://127.0.0.1:6379/0", "tls": {"ca_file": "ca.crt"}},
            "store: tls applies to rediss://, rediss+sentinel:// and rediss+cluster:// URLs; "
            "this one is redis://",
        ),
        (
            {"url": "rediss://127.0.0.1:6380/0", "tls": {"key_file": "client.key"}},
            "store.tls: key_file is the key of cert_file: give cert_file too",
        ),
        (
            {"url": "rediss://127.0.0.1:6380/0", "tls": {"ca": "ca.crt"}},
            "store.tls.ca: unknown key",
        ),
        (
            {"url": "sqlite:///routes.db", "max_connections": 8},
            "store: max_connections applies to Redis; SQLite uses one connection",
        ),
        (
            {"url": "sqlite:///routes.db", "durability": "wait_aof"},
            "store: durability applies to Redis; SQLite always syncs (synchronous=FULL)",
        ),
    ],
)
def test_store_tls_is_checked(store: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(config_text(store))
    assert refused.value.problems == [problem]


def test_store_tls_files_are_found_beside_the_configuration_file(tmp_path: Path) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    tls = {"ca_file": "certs/ca.crt", "cert_file": "/etc/taskgate/client.crt", "key_file": "k.pem"}
    (folder / "taskgate.yaml").write_text(
        config_text({"url": "rediss+cluster://:pw@10.0.0.1:7000", "tls": tls})
    )
    loaded = load_config(folder / "taskgate.yaml").store.tls
    assert loaded is not None
    assert loaded.ca_file == str(folder / "certs/ca.crt")
    assert loaded.cert_file == "/etc/taskgate/client.crt"
    assert loaded.key_file == str(folder / "k.pem")
