"""Which failed requests the status page counts as authentication refusals instead of listing."""

from __future__ import annotations

from gateway.config import LoggingConfig
from gateway.h1.request import DownstreamResponse
from gateway.observe.exchange import Exchange
from gateway.observe.observer import Observer


def exchange(*, tenant: str = "", backend: str = "", request_id: int | None = None) -> Exchange:
    seen = Exchange()
    seen.tenant, seen.backend, seen.request_id = tenant, backend, request_id
    seen.message = "refused"
    return seen


def observed(*answered: tuple[Exchange, int]) -> Observer:
    observer = Observer(LoggingConfig(access=False, recent_errors=5))
    for seen, status in answered:
        observer.finish(seen, DownstreamResponse(status=status))
    return observer


def test_the_401_and_the_403_answered_before_the_token_are_counted_not_listed() -> None:
    observer = observed(*[(exchange(), 401)] * 8, (exchange(), 403))

    assert observer.auth_refusals == 9
    assert not observer.failures
    assert observer.metrics.requests[("-", 401, "ok", "")] == 8  # /metrics counts them still


def test_the_failures_of_a_verified_caller_or_a_backend_are_listed() -> None:
    observer = observed(
        (exchange(tenant="acme"), 403),  # a Host or a scope refused after authentication
        (exchange(tenant="acme", backend="reports"), 401),  # a backend's own 401, relayed
        (exchange(backend="reports"), 401),  # the same with auth mode none
        (exchange(tenant="acme", request_id=7), 404),
    )

    assert observer.auth_refusals == 0
    assert [f.status for f in observer.failures] == [403, 401, 401, 404]


def test_a_403_once_the_body_was_read_is_listed_without_a_tenant_too() -> None:
    # auth mode none: no tenant; a missing scope is refused after the body is read.
    observer = observed((exchange(request_id=3), 403), (exchange(), 403))

    assert observer.auth_refusals == 1
    assert [f.status for f in observer.failures] == [403]


def test_refusals_are_counted_when_no_failure_is_kept() -> None:
    observer = Observer(LoggingConfig(access=False, recent_errors=0))
    observer.finish(exchange(), DownstreamResponse(status=401))

    assert observer.auth_refusals == 1
