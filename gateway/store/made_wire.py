"""The JSON the stores keep in a made task's record: its outcome, its questions' keys."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.store.made import HOLDER_STOPPED

# -32603: the core's internal error; the task failed for a reason of taskgate's, not the tool's.
_INTERNAL_ERROR = -32603


def failed_outcome(message: str, code: int = _INTERNAL_ERROR, data: Any = None) -> bytes:
    """The outcome of a failed task: the JSON-RPC error tasks/get shows as `error`."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return orjson.dumps({"error": error})


def holder_stopped_outcome() -> bytes:
    return failed_outcome(HOLDER_STOPPED)


def asked_keys(inputs: bytes) -> set[str]:
    """The keys of the questions a record's `inputs` holds (none when it holds none)."""
    if not inputs:
        return set()
    try:
        asked = orjson.loads(inputs)
    except orjson.JSONDecodeError:
        return set()
    return set(asked) if isinstance(asked, dict) else set()
