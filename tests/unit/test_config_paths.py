"""Relative paths in a configuration file name files beside it, whatever the working directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import load_config, parse_config
from gateway.process.cli import main

WITH_FILES = """\
store: {url: "sqlite:///./r.db"}
auth:
  mode: jwt
  issuer: https://issuer.example
  audience: https://taskgate.example/mcp
  keys:
    - {kid: a, alg: ES256, file: ./keys/k.pem}
    - {kid: b, alg: ES256, file: /etc/taskgate/b.pem}
backends:
  reports:
    replicas: ["http://127.0.0.1:9101/mcp"]
    upstream_auth: {bearer_file: reports.token}
  search:
    replicas: ["http://127.0.0.1:9102/mcp"]
    upstream_auth: {bearer_env: SEARCH_TOKEN}
routes:
  - {tools: [generate_report], backend: reports}
  - {tools: [search], backend: search}
"""

ROUTES_ONLY = """\
backends:
  reports: {replicas: ["http://127.0.0.1:9101/mcp"]}
routes:
  - {tools: [generate_report], backend: reports}
"""


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The configuration's folder, tmp_path/sub; the working directory is another one."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return (tmp_path / "sub").resolve()


def test_relative_files_and_sqlite_stores_resolve_beside_the_configuration(
    elsewhere: Path,
) -> None:
    (elsewhere / "taskgate.yaml").write_text(WITH_FILES)

    for given in ("../sub/taskgate.yaml", str(elsewhere / "taskgate.yaml")):
        config = load_config(given)

        assert config.store.url == f"sqlite:///{elsewhere}/r.db"
        assert [key.file for key in config.auth.keys] == [
            str(elsewhere / "keys" / "k.pem"),
            "/etc/taskgate/b.pem",  # absolute: as written
        ]
        reports = config.backends["reports"].upstream_auth
        assert reports is not None
        assert reports.bearer_file == str(elsewhere / "reports.token")
        assert config.backends["search"] == parse_config(WITH_FILES).backends["search"]


def test_the_default_store_lives_beside_the_configuration_too(elsewhere: Path) -> None:
    (elsewhere / "taskgate.yaml").write_text(ROUTES_ONLY)

    assert load_config("../sub/taskgate.yaml").store.url == (
        f"sqlite:///{elsewhere}/taskgate-routes.db"
    )


@pytest.mark.parametrize("url", ["sqlite:////var/lib/taskgate/r.db", "sqlite:///:memory:"])
def test_absolute_and_in_memory_stores_are_left_as_they_are(elsewhere: Path, url: str) -> None:
    (elsewhere / "taskgate.yaml").write_text(f'store: {{url: "{url}"}}\n' + ROUTES_ONLY)

    assert load_config(elsewhere / "taskgate.yaml").store.url == url


def test_a_configuration_from_text_keeps_its_paths_as_written() -> None:
    config = parse_config(WITH_FILES)

    assert config.store.url == "sqlite:///./r.db"
    assert config.auth.keys[0].file == "./keys/k.pem"


def test_check_from_another_directory_finds_the_key_file_and_names_the_resolved_store(
    elsewhere: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (elsewhere / "keys").mkdir()
    (elsewhere / "keys" / "k.pem").write_text("a PEM public key (check only looks for the file)")
    (elsewhere / "taskgate.yaml").write_text(WITH_FILES)
    (elsewhere / "reports.token").write_text("token")
    monkeypatch.setenv("SEARCH_TOKEN", "token")

    assert main(["check", "--config", "../sub/taskgate.yaml"]) == 0

    out, err = capsys.readouterr()
    assert f"store    sqlite:///{elsewhere}/r.db\n" in out
    assert err.splitlines() == [
        "taskgate: warning: auth.keys[1].file: /etc/taskgate/b.pem does not exist "
        "(run will not start)"
    ]
