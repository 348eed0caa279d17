"""The `limits` section as a user writes it (docs/limits.md): mistakes named by their YAML
path, and what a tenant's overrides make of the defaults, tool rates included."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, parse_config
from gateway.limits.policy import Policy

BASE = (
    "backends: {b: {replicas: ['http://127.0.0.1:1/mcp']}}\nroutes: [{tools: ['*'], backend: b}]\n"
)


def problems(limits: str) -> list[str]:
    with pytest.raises(ConfigError) as refused:
        parse_config(BASE + f"limits: {limits}\n")
    return refused.value.problems


def test_a_burst_needs_a_rate_wherever_it_is_set() -> None:
    assert problems("{tenant: {burst: 5}}") == ["limits: tenant: burst needs rate_per_s"]
    found = problems("{tenants: {acme: {principal: {burst: 5}}}}")
    assert found == ["limits: tenants.acme.principal: burst needs rate_per_s"]


def test_a_tool_rate_needs_its_rate_and_a_name() -> None:
    assert problems("{tools: {echo: {burst: 5}}}") == [
        "limits.tools.echo.rate_per_s: Field required"
    ]
    assert any(
        "a tool name must not be empty" in p for p in problems("{tools: {'': {rate_per_s: 1}}}")
    )
    assert any("rate_per_s" in p for p in problems("{tools: {echo: {rate_per_s: 0}}}"))


def test_a_tenants_tool_entries_replace_the_defaults_and_null_lifts_one() -> None:
    config = parse_config(
        BASE + "limits:\n"
        "  tools: {echo: {rate_per_s: 5}, report: {rate_per_s: 1, burst: 3}}\n"
        "  tenants:\n"
        "    acme: {tools: {echo: null, report: {rate_per_s: 2}, extra: {rate_per_s: 9}}}\n"
    )
    policy = Policy(config.limits, config.principal_defaults())
    default, acme = policy.of("globex"), policy.of("acme")
    assert sorted(default.tools) == ["echo", "report"]
    assert default.tools["report"][0].size == 3
    assert default.tools["echo"][0].size == 5  # one second of its rate
    assert sorted(acme.tools) == ["extra", "report"]
    assert acme.tools["report"][0].per_ms == pytest.approx(2 / 1000)
    assert policy.any
