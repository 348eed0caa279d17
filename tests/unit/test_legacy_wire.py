"""The 2025-era wire without I/O: the era test, the messages of a legacy POST, namespaced ids."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.legacy import wire
from gateway.legacy.wire import RPCAnswer
from gateway.protocol import era
from gateway.protocol.codes import EnvelopeError
from gateway.protocol.envelope import RPCNotification, RPCRequest

BACKEND_NAMES = st.from_regex(r"[A-Za-z0-9_.-]{1,40}", fullmatch=True)
IDS = st.one_of(st.integers(-(2**53) + 1, 2**53 - 1), st.text(max_size=60))


@given(backend=BACKEND_NAMES, upstream_id=IDS)
def test_a_namespaced_id_says_which_backend_asked_and_its_own_id(
    backend: str, upstream_id: int | str
) -> None:
    assert wire.denamespaced(wire.namespaced(backend, upstream_id)) == (backend, upstream_id)


def test_ids_taskgate_never_sent_are_not_read_as_namespaced() -> None:
    for client_id in (1, "1", "taskgate/", "taskgate/x", "taskgate//1", "taskgate/x/not json"):
        assert wire.denamespaced(client_id) is None
    assert wire.denamespaced("taskgate/x/true") is None  # a boolean is no JSON-RPC id


def test_two_backends_asking_with_one_id_get_two_ids() -> None:
    ask = orjson.dumps({"jsonrpc": "2.0", "id": 0, "method": "elicitation/create"})
    first = orjson.loads(wire.rewrite_request(ask, "reports"))["id"]
    second = orjson.loads(wire.rewrite_request(ask, "billing"))["id"]
    assert first != second


def test_only_requests_of_a_backend_are_rewritten() -> None:
    for message in (
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}},
        {"jsonrpc": "2.0", "id": 7, "result": {"content": []}},
        {"jsonrpc": "2.0", "id": 7, "result": {"text": '"method" "id"'}},
    ):
        data = orjson.dumps(message)
        assert wire.rewrite_request(data, "reports") is data  # relayed byte for byte


def test_the_answer_goes_back_under_the_backends_own_id() -> None:
    answer = RPCAnswer(id="taskgate/reports/3", value={"jsonrpc": "2.0", "id": "x", "result": {}})
    assert orjson.loads(wire.answer_upstream(answer, 3)) == {
        "jsonrpc": "2.0",
        "id": 3,
        "result": {},
    }


def test_the_era_is_the_bodys() -> None:
    modern = {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}
    assert era.is_modern(orjson.dumps({"method": "tools/list", "params": modern}))
    assert not era.is_modern(orjson.dumps({"method": "initialize", "params": {}}))


def test_a_legacy_post_is_one_message_or_a_bounded_batch() -> None:
    request = wire.parse(b'{"jsonrpc":"2.0","id":1,"method":"ping"}', max_depth=64)
    assert isinstance(request, RPCRequest)
    note = wire.parse(b'{"jsonrpc":"2.0","method":"notifications/initialized"}', max_depth=64)
    assert isinstance(note, RPCNotification)
    answer = wire.parse(b'{"jsonrpc":"2.0","id":"taskgate/a/1","result":{}}', max_depth=64)
    assert isinstance(answer, RPCAnswer)
    batch = wire.parse(b' [{"jsonrpc":"2.0","id":1,"method":"ping"}]', max_depth=64)
    assert isinstance(batch, list)
    assert len(batch) == 1
    too_many = orjson.dumps(
        [{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(wire.MAX_BATCH + 1)]
    )
    for refused in (
        too_many,
        b"[]",
        b'{"jsonrpc":"2.0","id":1,"result":{},"error":{}}',  # both
        b'{"jsonrpc":"2.0","result":{}}',  # an answer to no id
        b'{"jsonrpc":"2.0","id":1,"id":2,"result":{}}',  # a repeated key
    ):
        with pytest.raises(EnvelopeError):
            wire.parse(refused, max_depth=64)


def test_taskgates_lists_lose_their_2026_fields() -> None:
    listed = {
        "tools": [],
        "nextCursor": "c",
        "resultType": "complete",
        "ttlMs": 1,
        "cacheScope": "x",
    }
    assert wire.legacy_result({**listed, "_meta": {}}) == {"tools": [], "nextCursor": "c"}


def test_a_legacy_task_request_is_served_plain() -> None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"e","task":{"ttl":5}}}'
    message = wire.parse(body, max_depth=64)
    assert isinstance(message, RPCRequest)
    assert "task" not in orjson.loads(wire.without_task(message))["params"]


def test_initialize_offers_what_taskgate_carries_and_the_clients_revision() -> None:
    assert wire.negotiated("2025-03-26") == "2025-03-26"
    assert wire.negotiated("2026-07-28") == "2025-11-25"
    assert wire.negotiated(None) == "2025-11-25"
    discovered = {
        "tools": {"listChanged": True},
        "resources": {"listChanged": True, "subscribe": True},
        "extensions": {"io.modelcontextprotocol/tasks": {}},
    }
    result = wire.initialize_result("2025-06-18", discovered, {"name": "taskgate"})
    assert result["capabilities"] == {
        "tools": {"listChanged": True},
        "resources": {"listChanged": True, "subscribe": False},
    }
