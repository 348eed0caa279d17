"""taskgate serves thirteen methods; everything else is Method not found (-32601)."""

from __future__ import annotations

import pytest

from gateway.protocol.codes import Code, MethodError
from gateway.protocol.methods import METHODS, MethodClass, classify


@pytest.mark.parametrize(
    ("method", "cls", "name_param", "needs_tasks"),
    [
        ("server/discover", MethodClass.DISCOVER, None, False),
        ("tools/list", MethodClass.LIST_TOOLS, None, False),
        ("tools/call", MethodClass.CALL_TOOL, "name", False),
        ("prompts/list", MethodClass.LIST_PROMPTS, None, False),
        ("prompts/get", MethodClass.GET_PROMPT, "name", False),
        ("resources/list", MethodClass.LIST_RESOURCES, None, False),
        ("resources/templates/list", MethodClass.LIST_TEMPLATES, None, False),
        ("resources/read", MethodClass.READ_RESOURCE, "uri", False),
        ("completion/complete", MethodClass.COMPLETE, None, False),
        ("tasks/get", MethodClass.TASK, "taskId", True),
        ("tasks/update", MethodClass.TASK, "taskId", True),
        ("tasks/cancel", MethodClass.TASK, "taskId", True),
    ],
)
def test_each_served_method_is_classified(
    method: str, cls: MethodClass, name_param: str | None, needs_tasks: bool
) -> None:
    spec = classify(method, 1)

    assert spec.method == method
    assert spec.cls is cls
    assert spec.name_param == name_param
    assert spec.needs_tasks is needs_tasks


def test_exactly_thirteen_methods_are_served() -> None:
    assert set(METHODS) == {
        "server/discover",
        "tools/list",
        "tools/call",
        "prompts/list",
        "prompts/get",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "completion/complete",
        "tasks/get",
        "tasks/update",
        "tasks/cancel",
        "subscriptions/listen",
    }


@pytest.mark.parametrize(
    "method",
    [
        "tasks/result",  # removed by SEP-2663
        "tasks/list",  # removed by SEP-2663
        "tasks/status",  # never existed
        "resources/subscribe",  # 2025-era; in 2026-07-28 resourceSubscriptions on a listen
        "initialize",
        "ping",
        "Tools/Call",
        "tools/call ",
        "",
        "no such method",
    ],
)
def test_any_other_method_is_not_found(method: str) -> None:
    with pytest.raises(MethodError) as info:
        classify(method, "req-1")

    assert info.value.code == Code.METHOD_NOT_FOUND
    assert int(info.value.code) == -32601
    assert info.value.request_id == "req-1"


def test_not_found_carries_no_id_when_none_is_given() -> None:
    with pytest.raises(MethodError) as info:
        classify("tasks/list")

    assert info.value.request_id is None
