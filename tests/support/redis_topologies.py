"""Redis topologies for tests, on loopback: a cluster, a Sentinel group, a TLS server.

Each is made of Debian's redis-server processes (tests/support/procs.py's RedisProcess and
kin), started by the tests, waited for by polling under a deadline, stopped by pid.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.procs import (
    LOOPBACK,
    POLL_INTERVAL,
    READY_TIMEOUT,
    REDIS_SERVER,
    ProcessStartError,
    RedisProcess,
    pick_port,
    stop_all,
)

SERVER_AUTH = ExtendedKeyUsageOID.SERVER_AUTH
CLIENT_AUTH = ExtendedKeyUsageOID.CLIENT_AUTH
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
SERVICE = "taskgate"  # the Sentinel service name of the group's master
PASSWORD = "s3cret-pass"  # what the cluster, the Sentinel group and the TLS server ask for


def wait_until(what: str, check: Callable[[], bool], timeout: float = READY_TIMEOUT) -> None:
    """Poll `check` until it holds; ProcessStartError naming `what` at the deadline.

    Redis errors count as "not yet": a node that is still joining may refuse a command.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except redis.RedisError:
            pass
        if time.monotonic() >= deadline:
            raise ProcessStartError(f"{what}: not within {timeout:g}s")
        time.sleep(POLL_INTERVAL)


def running(process: RedisProcess) -> bool:
    """Whether `process` was started and not stopped or killed since."""
    try:
        process.pid  # noqa: B018  # raises once it is stopped
    except RuntimeError:
        return False
    return True


class _Group:
    """`with` starts every process of the group and stops them all at the end."""

    def start(self) -> Self:
        raise NotImplementedError

    def processes(self) -> Sequence[RedisProcess]:
        raise NotImplementedError

    def cleanup(self) -> None:
        stop_all(self.processes())

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


# -- TLS ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificates:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate it signed,
    and a second CA that signed nothing here (a client trusting it cannot verify the server)."""

    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def server_cert(self) -> Path:
        return self.dir / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.dir / "server.key"

    @property
    def client_cert(self) -> Path:
        return self.dir / "client.crt"

    @property
    def client_key(self) -> Path:
        return self.dir / "client.key"

    @property
    def other_ca(self) -> Path:
        return self.dir / "other-ca.crt"


def make_certificates(folder: Path) -> Certificates:
    """Write a CA, a server and a client certificate (EC P-256, valid for a day) to `folder`."""
    files = Certificates(folder)
    ca_key, ca_cert = _authority("taskgate test CA")
    _write_key(files.dir / "ca.key", ca_key)
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _, other = _authority("some other CA")
    files.other_ca.write_bytes(other.public_bytes(serialization.Encoding.PEM))
    server_san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(LOOPBACK))])
    for cert_path, key_path, name, san, usage in (
        # A node is a client too: of its master (replication) and of its cluster peers (bus).
        (files.server_cert, files.server_key, "redis", server_san, [SERVER_AUTH, CLIENT_AUTH]),
        (files.client_cert, files.client_key, "taskgate", None, [CLIENT_AUTH]),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = _builder(name, key.public_key(), ca_cert.subject)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        if san is not None:
            builder = builder.add_extension(san, critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key_path, key)
    return files


def _authority(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = _builder(name, key.public_key(), subject).add_extension(
        x509.BasicConstraints(ca=True, path_length=None), critical=True
    )
    builder = builder.add_extension(
        x509.KeyUsage(
            digital_signature=True,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=True,
            crl_sign=True,
            encipher_only=False,
            decipher_only=False,
        ),
        critical=True,
    )
    return key, builder.sign(key, hashes.SHA256())


def _builder(
    name: str, public_key: ec.EllipticCurvePublicKey, issuer: x509.Name
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


class PasswordRedisProcess(RedisProcess):
    """A redis-server that asks for PASSWORD (and gives it to its master, when it replicates);
    with `tls`, it also speaks TLS on `tls_port` and requires a client certificate there, and
    replicates over TLS. Its plain port (loopback) stays the tests' back door: ready checks,
    flushes, inspection.

    The password is set once the server answers: RedisProcess's ready check asks without one.
    """

    def __init__(
        self, *, tls: Certificates | None = None, extra_args: tuple[str, ...] = ()
    ) -> None:
        super().__init__(extra_args=extra_args)
        self.tls = tls
        self.tls_port = 0

    @property
    def client_port(self) -> int:
        """The port taskgate is given: the TLS one when there is one."""
        return self.tls_port if self.tls is not None else self.port

    def argv(self, port: int) -> list[str]:
        # A replica is served at once, not after the 5 s a master waits for more of them.
        argv = [*super().argv(port), "--repl-diskless-sync-delay", "0"]
        if self.tls is None:
            return argv
        if self._port is None:  # a first start (perhaps another try): a fresh TLS port too
            self.tls_port = pick_port()
        return [*argv, "--tls-port", str(self.tls_port), *tls_arguments(self.tls)]

    def start(self, timeout: float = READY_TIMEOUT) -> Self:
        super().start(timeout)
        self._protect()
        return self

    def restart(self, timeout: float = READY_TIMEOUT) -> None:
        super().restart(timeout)
        self._protect()

    def _protect(self) -> None:
        with redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=5) as client:
            client.config_set("masterauth", PASSWORD)
            client.config_set("requirepass", PASSWORD)

    def client(self) -> redis.Redis:
        return redis.Redis(host=LOOPBACK, port=self.port, password=PASSWORD, socket_timeout=5)


def tls_arguments(files: Certificates) -> list[str]:
    """A node's TLS options but its port: its certificate, the CA, client certificates
    required, and TLS to its master."""
    return [
        *("--tls-cert-file", str(files.server_cert), "--tls-key-file", str(files.server_key)),
        *("--tls-ca-cert-file", str(files.ca), "--tls-auth-clients", "yes"),
        *("--tls-replication", "yes"),
    ]


def redis_cli_tls(files: Certificates | None) -> list[str]:
    if files is None:
        return []
    return [
        *("--tls", "--cacert", str(files.ca)),
        *("--cert", str(files.client_cert), "--key", str(files.client_key)),
    ]


# -- Cluster ------------------------------------------------------------------------------------


class ClusterNodeProcess(PasswordRedisProcess):
    """One cluster node; its bus port is picked beside its client port (not port + 10000, which
    may not exist) and kept across restarts, so a restarted node rejoins where it was."""

    def __init__(self, *, tls: Certificates | None = None) -> None:
        super().__init__(tls=tls)
        self.bus_port = 0

    def argv(self, port: int) -> list[str]:
        if self._port is None:  # a first start (perhaps another try): a fresh bus port too
            self.bus_port = pick_port()
        cluster = [
            *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
            *("--cluster-port", str(self.bus_port), "--cluster-node-timeout", "1000"),
            # A replica takes over at once, however stale its last contact looked.
            *("--cluster-replica-validity-factor", "0"),
        ]
        # With TLS, the nodes announce their TLS ports and talk TLS on the bus too.
        return [*super().argv(port), *cluster, *(("--tls-cluster", "yes") if self.tls else ())]

    def role(self) -> str:
        with self.client() as client:
            return str(client.info("replication")["role"])

    def cluster_info(self) -> dict[str, str]:
        with self.client() as client:
            info = client.cluster("INFO")
        return {str(key): str(value) for key, value in info.items()}


class ClusterGroup(_Group):
    """A Redis Cluster of `masters` masters (each with `replicas` replicas), made by
    `redis-cli --cluster create`, every node asking for PASSWORD; with `tls`, on TLS only."""

    def __init__(
        self, masters: int = 3, replicas: int = 0, tls: Certificates | None = None
    ) -> None:
        self.masters = masters
        self.replicas = replicas
        self.tls = tls
        self.nodes = [ClusterNodeProcess(tls=tls) for _ in range(masters * (1 + replicas))]

    def processes(self) -> Sequence[RedisProcess]:
        return self.nodes

    @property
    def url(self) -> str:
        """A redis+cluster (rediss+cluster) URL seeded with the first three nodes."""
        seeds = ",".join(f"{LOOPBACK}:{node.client_port}" for node in self.nodes[:3])
        scheme = "redis+cluster" if self.tls is None else "rediss+cluster"
        return f"{scheme}://:{PASSWORD}@{seeds}"

    def start(self) -> Self:
        for node in self.nodes:
            node.start()
        create = [
            *(REDIS_CLI, *redis_cli_tls(self.tls), "--cluster", "create"),
            *(f"{LOOPBACK}:{node.client_port}" for node in self.nodes),
            *("--cluster-replicas", str(self.replicas), "--cluster-yes"),
        ]
        # The password through the environment: redis-cli warns about -a on its command line.
        done = subprocess.run(
            create,
            env={**os.environ, "REDISCLI_AUTH": PASSWORD},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=READY_TIMEOUT,
            check=False,
        )
        if done.returncode != 0:
            raise ProcessStartError(f"redis-cli --cluster create failed:\n{done.stdout.decode()}")
        self.wait_healthy()
        return self

    def wait_healthy(self, timeout: float = READY_TIMEOUT) -> None:
        """Until every running node says cluster_state:ok and knows every other node, and each
        master has its replicas online."""
        alive = [node for node in self.nodes if running(node)]

        def healthy() -> bool:
            for node in alive:
                info = node.cluster_info()
                if info.get("cluster_state") != "ok" or int(info["cluster_known_nodes"]) < len(
                    self.nodes
                ):
                    return False
            return all(self._online_replicas(node) >= self.replicas for node in self.primaries())

        wait_until("the cluster to be ok", healthy, timeout)

    def primaries(self) -> list[ClusterNodeProcess]:
        """The running nodes that are masters now (a failover changes which)."""
        return [node for node in self.nodes if running(node) and node.role() == "master"]

    def flushall(self) -> None:
        for node in self.primaries():
            node.flushall()

    def owner_of(self, key: str) -> ClusterNodeProcess:
        """The master that holds `key`'s slot now, as the cluster says."""
        return self.owners_of([key])[key]

    def owners_of(self, keys: Sequence[str]) -> dict[str, ClusterNodeProcess]:
        """The master of each key's slot now, asked of one client."""
        seed = next(node for node in self.nodes if running(node))
        by_port = {node.client_port: node for node in self.nodes}
        tls = {} if self.tls is None else _redis_py_tls(self.tls)
        with redis.RedisCluster(
            host=LOOPBACK, port=seed.client_port, password=PASSWORD, socket_timeout=5, **tls
        ) as client:
            return {key: by_port[int(client.get_node_from_key(key).port)] for key in keys}

    def replica_of(self, master: ClusterNodeProcess) -> ClusterNodeProcess:
        """The replica of `master` (this group has one per master when it has replicas)."""
        with master.client() as client:
            port = int(client.info("replication")["slave0"]["port"])
        return next(node for node in self.nodes if port in (node.port, node.client_port))

    @staticmethod
    def _online_replicas(node: ClusterNodeProcess) -> int:
        with node.client() as client:
            info = client.info("replication")
        return sum(
            1
            for key, value in info.items()
            if key.startswith("slave") and isinstance(value, dict) and value["state"] == "online"
        )


@contextlib.contextmanager
def paused(process: RedisProcess) -> Iterator[None]:
    """SIGSTOP `process` (our own child, by pid) for the block: a replica that stops answering
    without closing its link, as a stalled machine would."""
    os.kill(process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(process.pid, signal.SIGCONT)


# -- Sentinel -----------------------------------------------------------------------------------


class SentinelProcess(RedisProcess):
    """`redis-server sentinel.conf --sentinel` watching SERVICE at `master_port`; with `tls`,
    answering on `tls_port` too and talking TLS to the data nodes."""

    def __init__(self, master_port: int, *, tls: Certificates | None = None) -> None:
        super().__init__()
        self.master_port = master_port
        self.tls = tls
        self.tls_port = 0

    @property
    def client_port(self) -> int:
        return self.tls_port if self.tls is not None else self.port

    def argv(self, port: int) -> list[str]:
        conf = self.dir / "sentinel.conf"
        tls = ""
        if self.tls is not None:
            if self._port is None:
                self.tls_port = pick_port()
            options = tls_arguments(self.tls)
            pairs = zip(options[::2], options[1::2], strict=True)
            tls = f"tls-port {self.tls_port}\n" + "".join(
                f"{name.removeprefix('--')} {value}\n" for name, value in pairs
            )
        # Sentinel rewrites its file as it learns the group: it must be its own and writable.
        conf.write_text(
            f"port {port}\nbind {LOOPBACK}\ndir {self.dir}\n{tls}"
            f"sentinel monitor {SERVICE} {LOOPBACK} {self.master_port} 2\n"
            f"sentinel auth-pass {SERVICE} {PASSWORD}\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 5000\n"
        )
        return [REDIS_SERVER, str(conf), "--sentinel"]

    def flushall(self) -> None:
        raise RuntimeError("a sentinel holds no data")


class SentinelGroup(_Group):
    """One master, one replica and three sentinels (quorum 2), the data nodes asking for
    PASSWORD; the sentinels themselves ask for none. With `tls`, all of them on TLS."""

    def __init__(self, tls: Certificates | None = None) -> None:
        self.tls = tls
        self.master = PasswordRedisProcess(tls=tls)
        self.replica: PasswordRedisProcess | None = None
        self.sentinels: list[SentinelProcess] = []

    def processes(self) -> Sequence[RedisProcess]:
        data = [self.master] if self.replica is None else [self.master, self.replica]
        return [*self.sentinels, *data]

    @property
    def url(self) -> str:
        hosts = ",".join(f"{LOOPBACK}:{sentinel.client_port}" for sentinel in self.sentinels)
        scheme = "redis+sentinel" if self.tls is None else "rediss+sentinel"
        return f"{scheme}://:{PASSWORD}@{hosts}/{SERVICE}"

    def start(self) -> Self:
        self.master.start()
        self.replica = PasswordRedisProcess(
            tls=self.tls, extra_args=("--replicaof", LOOPBACK, str(self.master.client_port))
        )
        self.replica.start()
        wait_until("the replica to sync", lambda: self.online_replicas(self.master) >= 1)
        self.sentinels = [SentinelProcess(self.master.client_port, tls=self.tls) for _ in range(3)]
        for sentinel in self.sentinels:
            sentinel.start()
        self.wait_watched()
        return self

    def wait_watched(self, timeout: float = READY_TIMEOUT) -> None:
        """Until each sentinel knows the two others and sees an online replica: a failover
        can be agreed on then."""

        def watched() -> bool:
            for sentinel in self.sentinels:
                with sentinel.client() as client:
                    others = client.execute_command("SENTINEL", "SENTINELS", SERVICE)
                    replicas = client.execute_command("SENTINEL", "REPLICAS", SERVICE)
                if len(others) < len(self.sentinels) - 1:
                    return False
                if not any(_flags(replica) == {"slave"} for replica in replicas):
                    return False
            return True

        wait_until("the sentinels to watch the group", watched, timeout)

    def master_port(self) -> int:
        """The port of the master the sentinels name now."""
        with self.sentinels[0].client() as client:
            _, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return int(port)

    def flushall(self) -> None:
        self.master.flushall()

    @staticmethod
    def online_replicas(node: RedisProcess) -> int:
        with node.client() as client:
            return int(client.info("replication")["connected_slaves"])


def _flags(replica: object) -> set[str]:
    """The flags of one SENTINEL REPLICAS entry (a dict in RESP2 parsing, or a flat list)."""
    if isinstance(replica, dict):
        raw = replica.get("flags") or replica.get(b"flags", b"")
    else:
        items = list(replica)  # type: ignore[call-overload]
        raw = dict(zip(items[::2], items[1::2], strict=True)).get(b"flags", b"")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return set(text.split(","))


class StandaloneGroup(_Group):
    """One redis-server asking for PASSWORD, on TLS when given `tls`."""

    def __init__(self, tls: Certificates | None = None) -> None:
        self.tls = tls
        self.server = PasswordRedisProcess(tls=tls)

    def processes(self) -> Sequence[RedisProcess]:
        return [self.server]

    def start(self) -> Self:
        self.server.start()
        return self

    @property
    def url(self) -> str:
        scheme = "redis" if self.tls is None else "rediss"
        return f"{scheme}://:{PASSWORD}@{LOOPBACK}:{self.server.client_port}/0"

    def flushall(self) -> None:
        self.server.flushall()


@contextlib.contextmanager
def certificates() -> Iterator[Certificates]:
    """A throwaway CA and its certificates in a temporary folder, removed at the end."""
    folder = Path(tempfile.mkdtemp(prefix="taskgate-tls-"))
    try:
        yield make_certificates(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _redis_py_tls(files: Certificates) -> dict[str, Any]:
    return {
        "ssl": True,
        "ssl_ca_certs": str(files.ca),
        "ssl_certfile": str(files.client_cert),
        "ssl_keyfile": str(files.client_key),
    }
