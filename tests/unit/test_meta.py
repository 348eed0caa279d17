"""Every request declares its protocol version and client capabilities in params._meta."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.protocol.codes import Code, MetaError, VersionError
from gateway.protocol.envelope import RPCRequest
from gateway.protocol.meta import (
    CLIENT_CAPABILITIES_KEY,
    PROTOCOL_VERSION_KEY,
    SUPPORTED_VERSIONS,
    TASKS_EXTENSION,
    Meta,
    check_version,
    read_meta,
)

VERSION = "2026-07-28"


def request(params: dict[str, Any], request_id: str | int = 11) -> RPCRequest:
    return RPCRequest(id=request_id, method="tools/list", params=params, body=b"{}")


def with_meta(**meta: Any) -> RPCRequest:
    return request({"_meta": meta})


def good_meta(**overrides: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {PROTOCOL_VERSION_KEY: VERSION, CLIENT_CAPABILITIES_KEY: {}}
    meta.update(overrides)
    return meta


def test_a_request_with_both_required_keys_reads_its_meta() -> None:
    capabilities: dict[str, Any] = {"extensions": {TASKS_EXTENSION: {}}}
    meta = read_meta(request({"_meta": good_meta(**{CLIENT_CAPABILITIES_KEY: capabilities})}))

    assert (meta.protocol_version, meta.client_capabilities) == (VERSION, capabilities)


def test_other_meta_keys_are_allowed() -> None:
    params = {
        "_meta": good_meta(
            **{"io.modelcontextprotocol/clientInfo": {"name": "c", "version": "1"}},
            progressToken="p",
            traceparent="00-abc-def-01",
        )
    }

    assert read_meta(request(params)).protocol_version == VERSION


def test_meta_is_never_inferred_when_missing() -> None:
    with pytest.raises(MetaError) as info:
        read_meta(request({}))

    assert info.value.code == Code.INVALID_PARAMS
    assert info.value.request_id == 11


@pytest.mark.parametrize("meta", [None, [], "2026-07-28", 1, True])
def test_meta_must_be_an_object(meta: Any) -> None:
    with pytest.raises(MetaError) as info:
        read_meta(request({"_meta": meta}))

    assert info.value.code == Code.INVALID_PARAMS


@pytest.mark.parametrize(
    "missing",
    [
        [PROTOCOL_VERSION_KEY],
        [CLIENT_CAPABILITIES_KEY],
        [PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY],
    ],
)
def test_each_required_key_is_required(missing: list[str]) -> None:
    meta = good_meta()
    for key in missing:
        del meta[key]

    with pytest.raises(MetaError) as info:
        read_meta(request({"_meta": meta}, request_id="r-1"))

    assert info.value.code == Code.INVALID_PARAMS
    assert info.value.request_id == "r-1"


def test_an_unprefixed_key_does_not_stand_in_for_a_required_one() -> None:
    with pytest.raises(MetaError):
        read_meta(with_meta(protocolVersion=VERSION, clientCapabilities={}))


@pytest.mark.parametrize("version", [20260728, None, ["2026-07-28"], {"v": VERSION}, 1.5])
def test_the_version_must_be_a_string(version: Any) -> None:
    with pytest.raises(MetaError) as info:
        read_meta(request({"_meta": good_meta(**{PROTOCOL_VERSION_KEY: version})}))

    assert info.value.code == Code.INVALID_PARAMS


@pytest.mark.parametrize("capabilities", [None, [], "tasks", True, 0])
def test_the_capabilities_must_be_an_object(capabilities: Any) -> None:
    with pytest.raises(MetaError) as info:
        read_meta(request({"_meta": good_meta(**{CLIENT_CAPABILITIES_KEY: capabilities})}))

    assert info.value.code == Code.INVALID_PARAMS


def test_an_empty_capabilities_object_means_none_declared() -> None:
    meta = read_meta(request({"_meta": good_meta()}))

    assert meta.client_capabilities == {}
    assert not meta.has_extension(TASKS_EXTENSION)


# --- versions -----------------------------------------------------------------------------


def test_taskgate_serves_2026_07_28() -> None:
    assert SUPPORTED_VERSIONS == ("2026-07-28",)
    message = request({"_meta": good_meta()})

    check_version(read_meta(message), message)  # does not raise


@pytest.mark.parametrize(
    "version", ["2025-11-25", "2025-06-18", "2025-03-26", "", "2026-07-28 ", "2099-01-01"]
)
def test_an_unsupported_version_names_what_is_supported(version: str) -> None:
    message = request({"_meta": good_meta(**{PROTOCOL_VERSION_KEY: version})}, request_id=5)
    meta = read_meta(message)

    with pytest.raises(VersionError) as info:
        check_version(meta, message)

    assert info.value.code == Code.UNSUPPORTED_PROTOCOL_VERSION
    assert int(info.value.code) == -32022
    assert info.value.request_id == 5
    assert info.value.data == {"supported": ["2026-07-28"], "requested": version}


@pytest.mark.parametrize("version", ["2025-11-25", "2099-01-01", ""])
def test_reading_meta_does_not_judge_the_version(version: str) -> None:
    """The version is judged after the MCP-Protocol-Version header is compared with it, so
    that a request which disagrees with itself is told so (-32020), not -32022."""
    message = request({"_meta": good_meta(**{PROTOCOL_VERSION_KEY: version})})

    assert read_meta(message).protocol_version == version


def test_the_supported_list_can_be_narrowed_or_widened() -> None:
    message = request({"_meta": good_meta(**{PROTOCOL_VERSION_KEY: "2025-11-25"})})
    meta = read_meta(message)

    check_version(meta, message, supported=("2025-11-25", VERSION))
    with pytest.raises(VersionError) as info:
        check_version(meta, message, supported=(VERSION, "2026-12-01"))

    assert info.value.data == {"supported": [VERSION, "2026-12-01"], "requested": "2025-11-25"}


# --- extensions ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capabilities", "expected"),
    [
        ({"extensions": {TASKS_EXTENSION: {}}}, True),
        ({"extensions": {TASKS_EXTENSION: {"version": "draft"}}, "sampling": {}}, True),
        ({}, False),
        ({"extensions": {}}, False),
        ({"extensions": {"io.example/other": {}}}, False),
        ({"extensions": {TASKS_EXTENSION: True}}, False),
        ({"extensions": {TASKS_EXTENSION: None}}, False),
        ({"extensions": [TASKS_EXTENSION]}, False),
        ({"extensions": TASKS_EXTENSION}, False),
        ({TASKS_EXTENSION: {}}, False),
    ],
)
def test_an_extension_counts_only_when_declared_as_an_object(
    capabilities: dict[str, Any], expected: bool
) -> None:
    meta = Meta(protocol_version=VERSION, client_capabilities=capabilities)

    assert meta.has_extension(TASKS_EXTENSION) is expected


def test_a_2025_initialize_is_told_which_revision_taskgate_serves() -> None:
    """The core (basic/versioning): a modern-only server SHOULD name its versions in any error
    to initialize."""
    params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c"}}
    legacy = RPCRequest(id=0, method="initialize", params=params, body=b"{}")
    with pytest.raises(MetaError) as info:
        read_meta(legacy)
    assert info.value.code == Code.INVALID_PARAMS
    assert "2026-07-28" in info.value.message
    assert "2025 handshake" in info.value.message
    assert info.value.data == {"supported": list(SUPPORTED_VERSIONS)}
