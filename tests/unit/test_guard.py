"""Origin and Host checks against DNS rebinding, from the public and the admin listener's
configuration."""

from __future__ import annotations

import pytest

from gateway.config import AdminConfig, ListenConfig
from gateway.pipeline.guard import Guard


def guard(
    host: str = "127.0.0.1",
    origins: tuple[str, ...] = (),
    hosts: tuple[str, ...] = (),
) -> Guard:
    return Guard(ListenConfig(host=host, allowed_origins=origins, allowed_hosts=hosts))


# --- Origin -------------------------------------------------------------------------------


def test_a_request_without_origin_passes() -> None:
    assert guard().origin_allowed(None)


@pytest.mark.parametrize(
    "origin",
    [
        "http://localhost:3000",
        "http://localhost",
        "https://localhost:8443",
        "http://LOCALHOST:3000",
        "http://127.0.0.1",
        "http://127.0.0.1:8080",
        "http://127.1.2.3",
        "http://[::1]:8080",
        "http://[::1]",
        "http://app.localhost:5173",
        "http://localhost:3000/",
    ],
)
def test_loopback_origins_pass(origin: str) -> None:
    assert guard().origin_allowed(origin)


@pytest.mark.parametrize(
    "origin",
    [
        "https://evil.example",
        "http://evil.example:3000",
        "http://localhost.evil.example",
        "http://127.0.0.1.nip.io",
        "http://192.168.1.10",
        "http://[::2]",
        "ftp://localhost",
        "file://",
        "chrome-extension://abcdef",
        "localhost",
        "",
    ],
)
def test_other_origins_are_refused(origin: str) -> None:
    assert not guard().origin_allowed(origin)


def test_the_null_origin_is_refused() -> None:
    assert not guard().origin_allowed("null")
    assert not guard(origins=("https://app.example",)).origin_allowed("null")


@pytest.mark.parametrize(
    "origin", ["http://[::1", "http://[evil]", "http://[]", "https://[::1:8080"]
)
def test_a_malformed_origin_is_refused_not_raised(origin: str) -> None:
    assert not guard().origin_allowed(origin)


@pytest.mark.parametrize(
    "origin",
    ["https://app.example", "https://APP.example", "https://app.example/", " https://app.example "],
)
def test_a_listed_origin_passes(origin: str) -> None:
    assert guard(origins=("https://app.example",)).origin_allowed(origin)


def test_a_listed_origin_does_not_admit_its_neighbours() -> None:
    allowed = guard(origins=("https://app.example",))

    assert not allowed.origin_allowed("http://app.example")
    assert not allowed.origin_allowed("https://app.example:8443")
    assert not allowed.origin_allowed("https://evil.app.example")


def test_a_star_admits_any_origin() -> None:
    assert guard(origins=("*",)).origin_allowed("https://anywhere.example")
    assert guard(origins=("*",)).origin_allowed("null")


# --- Host ---------------------------------------------------------------------------------


@pytest.mark.parametrize("listen", ["127.0.0.1", "localhost", "::1"])
@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost:8080",
        "LocalHost:8080",
        "127.0.0.1",
        "127.0.0.1:8080",
        "[::1]",
        "[::1]:8080",
        "app.localhost:5173",
    ],
)
def test_loopback_host_names_pass_on_a_loopback_listener(listen: str, host: str) -> None:
    assert guard(host=listen).host_allowed(host)


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8080", "192.168.1.10:8080", "localhost.evil.example", ""]
)
def test_other_host_names_are_refused_on_a_loopback_listener(host: str) -> None:
    assert not guard().host_allowed(host)


def test_a_request_without_host_passes() -> None:
    assert guard().host_allowed(None)


@pytest.mark.parametrize("host", ["gateway.internal", "gateway.internal:8080", "GATEWAY.internal"])
def test_allowed_hosts_widen_the_loopback_check(host: str) -> None:
    assert guard(hosts=("gateway.internal",)).host_allowed(host)
    assert not guard(hosts=("gateway.internal",)).host_allowed("other.internal")


@pytest.mark.parametrize("listen", ["0.0.0.0", "10.0.0.5", "gateway.example", "::"])
def test_a_listener_off_loopback_does_not_check_host(listen: str) -> None:
    assert guard(host=listen).host_allowed("evil.example:8080")


# --- the admin listener's section ---------------------------------------------------------


def admin_guard(host: str = "127.0.0.1", **allowed: tuple[str, ...]) -> Guard:
    return Guard(AdminConfig(host=host, **allowed))


def test_the_admin_section_is_read_as_the_listen_section_is() -> None:
    guard = admin_guard(
        allowed_hosts=("taskgate.internal",), allowed_origins=("https://ops.example",)
    )

    assert guard.host_allowed("127.0.0.1:9090")
    assert guard.host_allowed("taskgate.internal:9090")
    assert not guard.host_allowed("evil.example.com")
    assert guard.origin_allowed("http://localhost:9090")
    assert guard.origin_allowed("https://ops.example")
    assert not guard.origin_allowed("http://evil.example.com")


def test_an_admin_listener_off_loopback_checks_origin_but_not_host() -> None:
    # Prometheus and the kubelet send the pod's IP as Host; the bearer token is the check there.
    guard = admin_guard(host="0.0.0.0")

    assert guard.host_allowed("10.1.2.3:9090")
    assert not guard.origin_allowed("http://evil.example.com")


def test_the_admin_section_does_not_widen_the_public_one() -> None:
    public = Guard(ListenConfig())
    admin_guard(allowed_hosts=("taskgate.internal",), allowed_origins=("*",))

    assert not public.host_allowed("taskgate.internal")
    assert not public.origin_allowed("http://evil.example.com")
