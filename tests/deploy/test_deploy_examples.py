"""The deployment examples in deploy/ (docs/deploy.md): the Kubernetes manifests against the
Kubernetes API schemas, the compose file through `docker-compose config`, the Dockerfile read
instruction by instruction, and the taskgate configuration each one mounts through taskgate's
own validation. All offline: no image is built, no container or cluster runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from gateway.config import Config, parse_config
from gateway.config.loopback import is_loopback
from gateway.ops.readiness import STORE_CHECK_TIMEOUT_S
from gateway.process import cli

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE_CONFIG = DEPLOY / "taskgate.yaml"
# The oldest Kubernetes minor the examples claim, and a recent one (kubernetes-validate ships both).
KUBERNETES_VERSIONS = ("1.30", "1.35")


# --- Kubernetes -------------------------------------------------------------------------------


def manifests() -> list[tuple[str, dict[str, Any]]]:
    found = [
        (path.name, doc)
        for path in sorted(KUBERNETES.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if doc
    ]
    assert found, f"no manifest under {KUBERNETES}"
    return found


def manifest(kind: str) -> dict[str, Any]:
    """The one manifest of `kind`, read anew (a test may change its copy)."""
    (doc,) = (doc for _, doc in manifests() if doc["kind"] == kind)
    return doc


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = manifest("Deployment")["spec"]["template"]["spec"]
    return spec


def taskgate_container() -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod_spec()["containers"]
    (container,) = (c for c in containers if c["name"] == "taskgate")
    return container


def configmap_text() -> str:
    text: str = manifest("ConfigMap")["data"]["taskgate.yaml"]
    return text


def configmap_config() -> Config:
    return parse_config(configmap_text(), source="deploy/kubernetes ConfigMap taskgate.yaml")


def container_port(container: dict[str, Any], port: int | str) -> int:
    """A probe's or a Service's port, resolved through the container's named ports."""
    if isinstance(port, int):
        return port
    (number,) = (p["containerPort"] for p in container["ports"] if p.get("name") == port)
    return int(number)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    "doc", [doc for _, doc in manifests()], ids=[f"{n}:{d['kind']}" for n, d in manifests()]
)
def test_every_kubernetes_manifest_is_valid_against_the_api_schema_in_strict_mode(
    doc: dict[str, Any], version: str
) -> None:
    assert kubernetes_validate.validate(doc, version, strict=True) == version


def test_strict_validation_refuses_a_field_the_api_does_not_have() -> None:
    deployment = manifest("Deployment")
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["httpGett"] = probe.pop("httpGet")
    with pytest.raises(kubernetes_validate.ValidationError, match="httpGett"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def test_the_configmap_holds_a_configuration_taskgate_check_accepts_without_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configmap_config()
    path = tmp_path / "taskgate.yaml"
    path.write_text(configmap_text(), encoding="utf-8")
    assert cli.main(["check", "--config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{path}: OK")
    assert err == ""


def test_the_deployment_runs_taskgate_on_the_configmap_mounted_as_a_directory() -> None:
    container = taskgate_container()
    command = container["command"]
    assert command[:3] == ["taskgate", "run", "--config"]
    config_path = Path(command[3])
    (mount,) = (m for m in container["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    assert "subPath" not in mount  # a subPath mount never sees the ConfigMap change
    (volume,) = (v for v in pod_spec()["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == manifest("ConfigMap")["metadata"]["name"]
    assert config_path.name in manifest("ConfigMap")["data"]
    assert "--workers" in command


def test_the_grace_period_outlasts_the_prestop_sleep_and_the_drain() -> None:
    drain_s = configmap_config().listen.drain_timeout_s
    pre_stop = taskgate_container()["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    sleep_s = float(pre_stop[1])
    assert 0 < sleep_s < drain_s
    assert pod_spec()["terminationGracePeriodSeconds"] > sleep_s + drain_s


def test_the_probes_hit_the_admin_listener_the_configmap_configures() -> None:
    config = configmap_config()
    assert config.admin is not None
    assert not is_loopback(config.admin.host)  # the kubelet probes the pod's IP
    container = taskgate_container()
    readiness, liveness = container["readinessProbe"], container["livenessProbe"]
    assert readiness["httpGet"]["path"] == "/readyz"
    assert liveness["httpGet"]["path"] == "/healthz"
    for probe in (readiness, liveness):
        assert container_port(container, probe["httpGet"]["port"]) == config.admin.port
    # /readyz waits up to STORE_CHECK_TIMEOUT_S for the store's ping before it answers.
    assert readiness["timeoutSeconds"] > STORE_CHECK_TIMEOUT_S
    assert container_port(container, "mcp") == config.listen.port


def test_the_admin_token_comes_from_a_secret() -> None:
    config = configmap_config()
    assert config.admin is not None
    assert config.admin.bearer_env is not None
    (variable,) = (e for e in taskgate_container()["env"] if e["name"] == config.admin.bearer_env)
    assert set(variable["valueFrom"]["secretKeyRef"]) == {"name", "key"}


def test_the_pods_run_as_the_images_non_root_user_on_a_read_only_root() -> None:
    pod, container = pod_spec(), taskgate_container()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert str(pod["securityContext"]["runAsUser"]) == image_user().split(":")[0]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    # --workers share their numbers through a temporary folder: /tmp must be writable.
    (tmp,) = (m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
    (volume,) = (v for v in pod["volumes"] if v["name"] == tmp["name"])
    assert "emptyDir" in volume
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]


def test_the_service_and_the_budget_select_the_deployments_pods_in_one_namespace() -> None:
    deployment = manifest("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["replicas"] >= 2
    service = manifest("Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert "sessionAffinity" not in service["spec"]  # any pod serves any task
    (port,) = service["spec"]["ports"]
    assert container_port(taskgate_container(), port["targetPort"]) == (
        configmap_config().listen.port
    )
    budget = manifest("PodDisruptionBudget")
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    assert budget["spec"].get("maxUnavailable") == 1 or budget["spec"].get("minAvailable") == 1
    namespace = manifest("Namespace")["metadata"]["name"]
    for _, doc in manifests():
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace, doc["kind"]


# --- Docker Compose ---------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolated(value: Any) -> Any:
    """`${NAME:-default}` as compose resolves it with NAME unset; everything else as written."""
    if isinstance(value, str):
        return _VARIABLE.sub(lambda m: m.group(2) or "", value)
    if isinstance(value, list):
        return [interpolated(item) for item in value]
    if isinstance(value, dict):
        return {key: interpolated(item) for key, item in value.items()}
    return value


def compose() -> dict[str, Any]:
    """The compose file as compose reads it: anchors and `<<` merges resolved, defaults filled."""
    data: dict[str, Any] = interpolated(yaml.safe_load(COMPOSE.read_text(encoding="utf-8")))
    return data


def services_built_as(target: str) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in compose()["services"].items()
        if service.get("build", {}).get("target") == target
    }


def compose_config() -> Config:
    return parse_config(COMPOSE_CONFIG.read_text(encoding="utf-8"), source=str(COMPOSE_CONFIG))


def seconds(duration: str) -> float:
    """A compose duration such as 40s, 1m30s or 500ms."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts, duration
    assert "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def docker_compose() -> str:
    found = shutil.which("docker-compose")
    if found is None:
        pytest.fail("docker-compose is not installed: `make docker-compose` installs Debian's")
    return found


def run_compose_config(path: Path) -> subprocess.CompletedProcess[str]:
    # Only PATH passes: the operator's own TASKGATE_* variables must not change the outcome.
    return subprocess.run(
        [docker_compose(), "-f", str(path), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        check=False,
    )


def test_docker_compose_config_accepts_the_compose_file() -> None:
    result = run_compose_config(COMPOSE)
    assert result.returncode == 0, result.stderr


def test_docker_compose_config_refuses_a_key_compose_does_not_have(tmp_path: Path) -> None:
    # The check above means something only if the validator is strict.
    broken = tmp_path / "compose.yaml"
    text = COMPOSE.read_text(encoding="utf-8")
    broken.write_text(text.replace("\n  redis:\n", "\n  redis:\n    restart_policy: always\n", 1))
    (tmp_path / "taskgate.yaml").write_text(COMPOSE_CONFIG.read_text(encoding="utf-8"))
    result = run_compose_config(broken)
    assert result.returncode != 0
    assert "restart_policy" in result.stderr


def test_two_taskgate_services_mount_one_configuration_taskgate_check_accepts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    services = services_built_as("taskgate")
    assert len(services) == 2
    config_path = image_entrypoint()[3]
    for service in services.values():
        assert f"./{COMPOSE_CONFIG.name}:{config_path}:ro" in service["volumes"]
        for name, value in service["environment"].items():
            monkeypatch.setenv(name, value)
    compose_config()
    assert cli.main(["check", "--config", str(COMPOSE_CONFIG)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{COMPOSE_CONFIG}: OK")
    assert err == ""


def test_both_instances_share_one_redis_that_runs_with_aof() -> None:
    store = compose_config().store
    url = urlsplit(store.url)
    redis = compose()["services"][url.hostname]
    image, _, tag = redis["image"].partition(":")
    assert image == "redis"
    command = redis["command"]
    assert command[0] == "redis-server"
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert (url.port or 6379) == 6379
    if store.durability == "wait_aof":  # WAITAOF came with Redis 7.2
        assert tuple(int(part) for part in tag.split(".")[:2]) >= (7, 2)


def test_the_backend_replicas_are_the_two_demo_services_each_on_its_own_name() -> None:
    demos = services_built_as("demo-backend")
    assert len(demos) == 2
    (backend,) = compose_config().backends.values()
    for url in backend.replicas:
        parts = urlsplit(url)
        assert parts.hostname is not None
        command = demos[parts.hostname]["command"]
        assert command[command.index("--host") + 1] == parts.hostname
        assert int(command[command.index("--port") + 1]) == parts.port
    assert {urlsplit(url).hostname for url in backend.replicas} == set(demos)


def test_the_compose_healthcheck_is_the_images_and_stop_waits_for_the_drain() -> None:
    config = compose_config()
    for service in services_built_as("taskgate").values():
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD"
        assert test[1:] == image_healthcheck()
        assert seconds(service["stop_grace_period"]) > config.listen.drain_timeout_s
        assert service["read_only"] is True
        assert "/tmp" in service["tmpfs"]
        assert len(service["environment"]["TASKGATE_JWT_SECRET"].encode()) >= 32  # HS256 minimum


# --- Dockerfile -------------------------------------------------------------------------------


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; comments dropped, continued lines joined."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        keyword, _, rest = whole.partition(" ")
        found.append((keyword.upper(), rest.strip()))
    assert not pending, "a continued line runs off the end"
    return found


def stages() -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(name, base, instructions) per stage, in order; the last one is the default target."""
    result: list[tuple[str, str, list[tuple[str, str]]]] = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            base, _, name = rest.partition(" AS ")
            result.append((name.strip(), base.strip(), []))
        elif result:
            result[-1][2].append((keyword, rest))
    return result


def final_stage() -> list[tuple[str, str]]:
    return stages()[-1][2]


def one(keyword: str) -> str:
    (value,) = (rest for k, rest in final_stage() if k == keyword)
    return value


def image_base() -> str:
    """The image the default target starts from, through its stages and global ARG defaults."""
    args: dict[str, str] = {}
    for keyword, rest in instructions():
        if keyword == "FROM":
            break
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
    bases = {name: base for name, base, _ in stages()}
    base = stages()[-1][1]
    while base in bases:
        base = bases[base]
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)


def image_user() -> str:
    return one("USER")


def image_entrypoint() -> list[str]:
    entrypoint: list[str] = json.loads(one("ENTRYPOINT"))
    return entrypoint


def image_healthcheck() -> list[str]:
    """The HEALTHCHECK's exec-form command, after CMD."""
    options, _, command = one("HEALTHCHECK").partition("CMD ")
    assert options.split()
    assert all(option.startswith("--") for option in options.split())
    argv: list[str] = json.loads(command)
    return argv


def test_the_default_target_is_slim_python_running_as_a_numeric_non_root_user() -> None:
    assert stages()[-1][0] == "taskgate"
    image, _, tag = image_base().partition(":")
    assert image == "python"
    assert "slim" in tag
    user, _, group = image_user().partition(":")
    assert user.isdigit()
    assert int(user) != 0
    assert group.isdigit()
    assert int(group) != 0


def test_the_image_exposes_both_listeners_and_runs_taskgate_on_the_mounted_file() -> None:
    config = compose_config()
    assert config.admin is not None
    assert set(one("EXPOSE").split()) == {str(config.listen.port), str(config.admin.port)}
    entrypoint = image_entrypoint()
    assert entrypoint[:3] == ["taskgate", "run", "--config"]
    assert entrypoint[3] == "/etc/taskgate/taskgate.yaml"


def test_the_healthcheck_asks_readyz_on_the_admin_port_with_python_alone() -> None:
    config = compose_config()
    assert config.admin is not None
    argv = image_healthcheck()
    assert argv[:2] == ["python", "-c"]
    assert "urllib.request" in argv[2]
    assert f"'http://127.0.0.1:{config.admin.port}/readyz'" in argv[2]


class _Readyz(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/readyz" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def readyz() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Readyz)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_the_healthcheck_passes_on_200_and_fails_on_503_and_on_no_listener(
    readyz: ThreadingHTTPServer,
) -> None:
    admin = compose_config().admin
    assert admin is not None
    code = image_healthcheck()[2]
    port = readyz.server_address[1]

    def healthcheck(on_port: int) -> int:
        program = code.replace(f"127.0.0.1:{admin.port}/", f"127.0.0.1:{on_port}/")
        assert program != code
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=30)
        return done.returncode

    assert healthcheck(port) == 0
    _Readyz.status = 503
    try:
        assert healthcheck(port) != 0
    finally:
        _Readyz.status = 200
    readyz.shutdown()
    readyz.server_close()
    assert healthcheck(port) != 0
