"""taskgate's own pages of a merged list: keyset cursors that any instance can continue.

A cursor is the base64url (unpadded) of `{"v":1,"list":<kind>,"after":[<route index>,<key>]}`:
the list it belongs to and the sort key of the last item it returned. The next page starts
after that key in the caller's own filtered list, so no secret is needed: a forged cursor can
only skip items the caller may see anyway, never reach another tenant's. Keys are unique within
a list (one item per name or URI), so every item comes exactly once while the list holds still.
"""

from __future__ import annotations

import base64
import binascii
import re
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

import orjson

from gateway.errors import BadCursor

SortKey = tuple[int, str]  # (the route's index in the YAML, the item's name or URI)
Entry = tuple[SortKey, dict[str, Any]]  # the item as its backend sent it, under its sort key

_VERSION = 1
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")


def encode_cursor(kind: str, after: SortKey) -> str:
    """The cursor of the page that follows the item keyed `after` in list `kind`."""
    raw = orjson.dumps({"v": _VERSION, "list": kind, "after": [after[0], after[1]]})
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(kind: str, cursor: object) -> SortKey | None:
    """The sort key a page of list `kind` starts after: None for the first page (no cursor),
    BadCursor for anything taskgate did not issue for this list (`""` included)."""
    if cursor is None:
        return None
    if not isinstance(cursor, str) or not _BASE64URL.fullmatch(cursor):
        raise BadCursor
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        decoded = orjson.loads(raw)
    except (binascii.Error, ValueError):  # orjson.JSONDecodeError is a ValueError
        raise BadCursor from None
    if not isinstance(decoded, dict) or decoded.get("v") != _VERSION:
        raise BadCursor
    after = decoded.get("after")
    if decoded.get("list") != kind or not isinstance(after, list) or len(after) != 2:
        raise BadCursor
    index, key = after
    if type(index) is not int or index < 0 or not isinstance(key, str):
        raise BadCursor
    return index, key


def page(
    kind: str, entries: Sequence[Entry], after: SortKey | None, page_size: int
) -> tuple[list[dict[str, Any]], str | None]:
    """The items of sorted `entries` that follow `after`, at most `page_size` of them, and the
    cursor of the next page when more follow."""
    start = 0 if after is None else bisect_right(entries, after, key=lambda entry: entry[0])
    chosen = entries[start : start + page_size]
    more = start + page_size < len(entries)
    next_cursor = encode_cursor(kind, chosen[-1][0]) if more and chosen else None
    return [item for _, item in chosen], next_cursor
