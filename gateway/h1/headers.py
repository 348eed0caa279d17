"""A request's header values as the handlers ask for them (`Headers`), and the fault of an
answer's header that must never be written (`BadHeaderValue`)."""

from __future__ import annotations


class BadHeaderValue(ValueError):
    """A header of an answer would carry CR, LF or NUL (or a character latin-1 cannot encode):
    written, it could split the answer, so it never is."""


class Headers:
    """A request's header values by case-insensitive name, decoded when asked for as aiohttp
    decodes them (UTF-8, any other byte kept as a surrogate). Indexed while the head is
    parsed: cheaper than building a multidict of every header, when a request asks for a few."""

    __slots__ = ("_index",)

    def __init__(self, index: dict[bytes, list[bytes]]) -> None:
        self._index = index

    def get(self, name: str, default: str | None = None) -> str | None:
        values = self._index.get(_key(name))
        return header_text(values[0]) if values else default

    def getall(self, name: str, default: tuple[()] = (), /) -> list[str] | tuple[()]:
        values = self._index.get(_key(name))
        return [header_text(value) for value in values] if values else default


def header_text(value: bytes) -> str:
    return value.decode("utf-8", "surrogateescape")


# Header names asked for, lower-cased as bytes once: the code asks for a handful.
_keys: dict[str, bytes] = {}


def _key(name: str) -> bytes:
    key = _keys.get(name)
    if key is None:
        key = name.lower().encode("latin-1")
        if len(_keys) < 256:
            _keys[name] = key
    return key
