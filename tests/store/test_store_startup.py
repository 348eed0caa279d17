"""taskgate with a Redis it cannot use: it starts, says which store and why (password masked) in
its log and on /readyz, and recovers by itself; unusable TLS files stop it at start."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gateway.config import StoreConfig, load_config
from gateway.errors import StartupError, StoreUnavailable
from gateway.process.cli import describe
from gateway.tasks.stores import open_store
from tests.store.conftest import StoreTarget
from tests.support.chaos import TaskgateProcess
from tests.support.gateway import gateway_config, serving
from tests.support.mcp import poll_until
from tests.support.procs import BackendProcess, free_ports
from tests.support.redis_topologies import PASSWORD, PasswordRedisProcess


async def readyz(http: aiohttp.ClientSession, admin_url: str) -> dict[str, Any]:
    async with http.get(admin_url + "/readyz") as response:
        body: dict[str, Any] = await response.json()
        body["status"] = response.status
        return body


async def test_taskgate_run_starts_without_its_store_says_why_and_recovers_once_it_answers(
    tmp_path: Path, report_backends: list[BackendProcess]
) -> None:
    server = PasswordRedisProcess().start()
    try:
        server.stop()  # its port, with nothing listening on it for now
        url = f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0"
        port, admin = free_ports(2)
        path = tmp_path / "taskgate.yaml"
        config = {
            "listen": {"host": "127.0.0.1", "port": port},
            "admin": {"host": "127.0.0.1", "port": admin},
            "store": {"url": url},
            "backends": {"reports": {"replicas": [b.url for b in report_backends]}},
            "routes": [{"tools": ["generate_report"], "backend": "reports"}],
        }
        path.write_text(yaml.safe_dump(config))
        taskgate = TaskgateProcess("unreachable-store", path, port)
        await taskgate.start()
        try:
            log = taskgate.log_text()
            masked = f"redis://:***@127.0.0.1:{server.port}/0"
            assert f"the task store {masked} is unavailable: cannot connect" in log
            assert "taskgate starts and keeps trying" in log
            assert PASSWORD not in log
            async with aiohttp.ClientSession() as http:
                down = await readyz(http, f"http://127.0.0.1:{admin}")
                assert down["status"] == 503
                assert down["store"].startswith(f"unavailable: the task store {masked}")
                assert PASSWORD not in str(down)
                server.restart()
                up = await poll_until(
                    lambda: readyz(http, f"http://127.0.0.1:{admin}"),
                    lambda body: body["store"] == "ok",
                )
                assert up["status"] == 200
        finally:
            taskgate.stop()
    finally:
        server.cleanup()


async def test_readyz_names_a_sentinel_service_nobody_watches(
    sentinel_target: StoreTarget, report_backends: list[BackendProcess]
) -> None:
    url = sentinel_target.url.replace("/taskgate", "/reports-cache")
    config = gateway_config(
        {"reports": [b.url for b in report_backends]},
        [(["generate_report"], "reports")],
        store=url,
        admin={"host": "127.0.0.1", "port": 0},
    )
    async with serving(config) as gateway, aiohttp.ClientSession() as http:
        assert gateway.admin_url is not None
        body = await readyz(http, gateway.admin_url)
    assert body["status"] == 503
    store = body["store"]
    assert store.startswith("unavailable: the task store redis+sentinel://:***@127.0.0.1:")
    assert "/reports-cache is unavailable: no sentinel named a master for the service" in store
    assert PASSWORD not in store


async def test_an_unreachable_cluster_at_start_is_logged_and_the_store_opened_anyway(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"redis+cluster://:{PASSWORD}@127.0.0.1:1,127.0.0.1:2"
    with caplog.at_level(logging.WARNING, logger="taskgate"):
        store = await open_store(StoreConfig(url=url, timeout_s=0.5))
    try:
        with pytest.raises(StoreUnavailable):
            await store.ping()
    finally:
        await store.close()
    (warning,) = [r.getMessage() for r in caplog.records if "keeps trying" in r.getMessage()]
    assert warning.startswith(
        "the task store redis+cluster://:***@127.0.0.1:1,127.0.0.1:2 is unavailable: "
        "the cluster could not be reached"
    )
    assert PASSWORD not in caplog.text


@pytest.mark.parametrize(
    ("files", "said"),
    [
        ({"ca_file": "missing-ca.crt"}, "store.tls.ca_file {dir}/missing-ca.crt: No such file"),
        ({"ca_file": "ca.crt", "cert_file": "ca.crt"}, "store.tls.cert_file {dir}/ca.crt / "),
    ],
    ids=["a CA file that is not there", "a certificate without its key"],
)
async def test_tls_files_taskgate_cannot_use_stop_it_at_start(
    tls_target: StoreTarget, tmp_path: Path, files: dict[str, str], said: str
) -> None:
    assert tls_target.tls is not None
    assert tls_target.tls.ca_file is not None
    shutil.copy(tls_target.tls.ca_file, tmp_path / "ca.crt")
    path = tmp_path / "taskgate.yaml"
    store = {"url": tls_target.url, "tls": files}
    backends = {"reports": {"replicas": ["http://127.0.0.1:9/mcp"]}}
    routes = [{"tools": ["*"], "backend": "reports"}]
    path.write_text(yaml.safe_dump({"store": store, "backends": backends, "routes": routes}))
    with pytest.raises(StartupError) as refused:
        await open_store(load_config(path).store)
    assert str(refused.value).startswith(said.format(dir=tmp_path))


def test_taskgate_check_prints_the_store_url_without_its_password() -> None:
    config = gateway_config(
        {"reports": ["http://127.0.0.1:9/mcp"]},
        [(["*"], "reports")],
        store=f"redis+sentinel://:{PASSWORD}@10.0.0.1:26379,10.0.0.2:26379/taskgate",
    )
    text = describe(config, "taskgate.yaml")
    assert "store    redis+sentinel://:***@10.0.0.1:26379,10.0.0.2:26379/taskgate" in text
    assert PASSWORD not in text
