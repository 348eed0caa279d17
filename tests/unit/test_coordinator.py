"""The coordinator's counts: a tenant's share of the process and of each backend, refusals
that name it, and every count back to zero after every way a request ends (an answer, an
error, a cancellation, a refusal, a reload between); tests/gateway/test_tenant_share.py
shows a listen stream holding none."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import Config, deprecation_warnings
from gateway.errors import Overloaded
from gateway.ops.reload_changes import needs_restart
from gateway.pipeline.coordinator import Coordinator, share_of


def coordinator(
    max_in_flight: int = 10, limits: dict[str, int] | None = None, share: float = 0.5
) -> Coordinator:
    return Coordinator(max_in_flight, limits or {"b": 10}, tenant_share=share)


def idle(made: Coordinator) -> bool:
    return (made.in_flight, made.per_tenant(), made.per_backend()) == (0, {}, {}) and not (
        made.per_backend_tenant()
    )


@pytest.mark.parametrize(
    ("limit", "share", "held"),
    [(10, 0.5, 5), (7, 0.5, 3), (1, 0.5, 1), (3, 0.1, 1), (100, 0.29, 29), (64, 1.0, 64)],
)
def test_a_share_is_the_floor_of_the_fraction_and_at_least_one(
    limit: int, share: float, held: int
) -> None:
    assert share_of(limit, share) == held


def test_a_tenant_holds_at_most_its_share_of_the_process_and_others_get_the_rest() -> None:
    made = coordinator()
    globex = [made.request("globex") for _ in range(5)]
    with pytest.raises(Overloaded) as refused:
        made.request("globex")
    assert refused.value.message == (
        "Tenant 'globex' holds its share of 5 of taskgate's 10 requests in flight "
        "(limits.tenant_share); retry"
    )
    assert refused.value.status == 503
    assert refused.value.headers == {"Retry-After": "1"}
    acme = [made.request("acme") for _ in range(5)]
    with pytest.raises(Overloaded, match="at its limit of 10 requests"):
        made.request("initech")  # the process's own limit still comes first
    assert made.per_tenant() == {"globex": 5, "acme": 5}
    for admission in globex + acme:
        with admission:
            pass
    assert idle(made)


def test_a_tenant_holds_at_most_its_share_of_a_backend() -> None:
    made = coordinator(100, {"b": 10, "c": 10})
    held = [made.request("globex") for _ in range(6)]
    keys = [admission.__enter__() for admission in held]
    for key in keys[:5]:
        made.route(key, "b", 1)
    with pytest.raises(Overloaded) as refused:
        made.route(keys[5], "b", 7)
    assert refused.value.request_id == 7
    assert refused.value.message == (
        "Tenant 'globex' holds its share of 5 of the 10 calls in flight to backend 'b' "
        "(limits.tenant_share); retry"
    )
    made.route(keys[5], "c", 8)  # another backend has a share of its own
    with made.request("acme") as key:
        made.route(key, "b", 9)
        assert made.per_backend_tenant() == {"b": {"globex": 5, "acme": 1}, "c": {"globex": 1}}
    for admission in held:
        admission.__exit__(None, None, None)
    assert idle(made)


def test_without_a_tenant_requests_count_under_one_key() -> None:
    made = coordinator(4)
    anonymous = [made.request("") for _ in range(2)]
    with pytest.raises(Overloaded, match=r"^Requests without a tenant hold their share of 2 "):
        made.request("")
    for admission in anonymous:
        with admission:
            pass
    assert idle(made)


def test_a_share_of_one_is_off() -> None:
    made = coordinator(4, {"b": 3}, share=1.0)
    held = [made.request("globex") for _ in range(4)]
    for admission in held[:3]:
        made.route(admission.__enter__(), "b", 1)
    with pytest.raises(Overloaded, match="Backend 'b' is at its limit of 3 calls"):
        made.route(held[3].__enter__(), "b", 1)
    with pytest.raises(Overloaded, match="at its limit of 4 requests"):
        made.request("globex")
    for admission in held:
        admission.__exit__(None, None, None)
    assert idle(made)


def test_every_count_is_given_back_after_an_error_or_a_refused_route() -> None:
    made = coordinator(10, {"b": 2})

    def failing_call() -> None:
        with made.request("globex") as key:
            made.route(key, "b", 1)
            raise RuntimeError("the upstream call failed")

    for _ in range(3):
        with pytest.raises(RuntimeError):
            failing_call()
    with made.request("globex") as one, made.request("acme") as two:
        made.route(one, "b", 1)
        made.route(two, "b", 1)
        with pytest.raises(Overloaded), made.request("initech") as three:
            made.route(three, "b", 1)  # refused: the backend is full, nothing counted
        assert made.per_backend() == {"b": 2}
    assert idle(made)


async def test_every_count_is_given_back_when_a_request_is_cancelled() -> None:
    made = coordinator(10, {"b": 4})
    inside = asyncio.Event()

    async def serve() -> None:
        with made.request("globex") as key:
            made.route(key, "b", 1)
            inside.set()
            await asyncio.Event().wait()  # until cancelled, as a client that leaves

    served = asyncio.create_task(serve())
    async with asyncio.timeout(5):
        await inside.wait()
    assert made.per_backend_tenant() == {"b": {"globex": 1}}
    served.cancel()
    with pytest.raises(asyncio.CancelledError):
        await served
    assert idle(made)


def test_a_2025_era_batch_moving_between_backends_is_counted_once() -> None:
    made = coordinator(10, {"b": 2, "c": 2})  # a share of 1 call each
    with made.request("globex") as key:
        made.route(key, "b", 1)
        made.route(key, "b", 2)  # a second member to the same backend: counted once
        made.route(key, "c", 3)
        assert made.per_backend_tenant() == {"c": {"globex": 1}}
        with made.request("globex") as other:
            made.route(other, "b", 4)  # b's share was given back when the batch moved on
    assert idle(made)


def test_a_reload_changes_limits_and_share_and_calls_in_flight_stay_counted() -> None:
    made = coordinator(10, {"b": 10, "gone": 4})
    held = [made.request("globex") for _ in range(4)]
    keys = [admission.__enter__() for admission in held]
    for key in keys[:3]:
        made.route(key, "b", 1)
    made.route(keys[3], "gone", 1)
    # Share up to 0.8: 8 of the process, 4 of b's new limit of 5; "gone" removed.
    made.reconfigure({"b": 5}, 0.8)
    more = [made.request("globex") for _ in range(4)]
    with pytest.raises(Overloaded, match="share of 8 of taskgate's 10"):
        made.request("globex")
    made.route(more[0].__enter__(), "b", 1)
    with pytest.raises(Overloaded, match="share of 4 of the 5 calls in flight to backend 'b'"):
        made.route(more[1].__enter__(), "b", 1)
    assert made.per_backend() == {"b": 4, "gone": 1}  # its call still counted
    # Added back while its call is in flight, it finds that call counted.
    made.reconfigure({"b": 5, "gone": 1}, 0.8)
    with pytest.raises(Overloaded, match="Backend 'gone' is at its limit of 1 calls"):
        made.route(more[1].__enter__(), "gone", 1)
    made.reconfigure({"b": 5}, 0.8)
    # Share down to 0.2 below what the tenant holds: nothing is cut, new ones are refused.
    made.reconfigure({"b": 5}, 0.2)
    with pytest.raises(Overloaded, match="share of 2 of taskgate's 10"):
        made.request("globex")
    for admission in held + more:
        admission.__exit__(None, None, None)
    assert idle(made)
    made.reconfigure({"b": 5}, 0.2)
    assert made.per_backend() == {}
    assert made.per_backend_tenant() == {}


def test_tenants_that_come_and_go_leave_a_bounded_table() -> None:
    made = coordinator(4, {"b": 2})
    for n in range(1000):
        with made.request(f"tenant-{n}") as key:
            made.route(key, "b", 1)
    assert idle(made)
    assert len(made._tenants) <= 2 * 4
    assert len(made._loads["b"].tenants) <= 2 * 2


def test_the_share_is_off_with_auth_none_and_a_reload_applies_it() -> None:
    base = {
        "backends": {"b": {"replicas": ["http://127.0.0.1:1/mcp"]}},
        "routes": [{"tools": ["*"], "backend": "b"}],
    }
    jwt = {
        "mode": "jwt",
        "issuer": "https://idp.test",
        "audience": "https://gateway.test/mcp",
        "jwks_url": "https://idp.test/jwks.json",
    }
    assert Config.model_validate(base).tenant_share == 1.0  # one anonymous caller
    running = Config.model_validate({**base, "auth": jwt})
    assert running.tenant_share == 0.5
    new = Config.model_validate({**base, "auth": jwt, "limits": {"tenant_share": 0.25}})
    assert new.tenant_share == 0.25
    assert needs_restart(running, new) == []
    # The key it replaced still works, and limits.tenant_share wins over it.
    old = Config.model_validate({**base, "auth": jwt, "listen": {"tenant_share": 0.3}})
    assert old.tenant_share == 0.3
    assert deprecation_warnings(old) == [
        "listen.tenant_share is deprecated: use limits.tenant_share"
    ]
    both = {**base, "auth": jwt, "listen": {"tenant_share": 0.3}, "limits": {"tenant_share": 0.2}}
    assert Config.model_validate(both).tenant_share == 0.2
