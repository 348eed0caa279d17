"""ConfigError, and pydantic's validation errors said with the YAML path of each mistake."""

from __future__ import annotations

from typing import Any


class ConfigError(Exception):
    """The configuration is unusable; `problems` name the YAML path of each mistake."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(f"{source}: " + "; ".join(problems))
        self.source = source
        self.problems = problems


def is_echo(error: Any, errors: list[Any]) -> bool:
    """A list's "too short after validation" that only repeats that one of its items failed
    (pydantic counts what is left): the item's own error says it."""
    if error["type"] != "too_short":
        return False
    loc = tuple(error["loc"])
    return any(
        len(other["loc"]) > len(loc) and tuple(other["loc"][: len(loc)]) == loc for other in errors
    )


def problem_of(error: Any) -> str:
    """One pydantic error said as `yaml.path: message` (`<top>` for the file itself)."""
    path = "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]
    ).lstrip(".")
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown key"
    elif error["type"] in ("tuple_type", "list_type"):
        # pydantic says "tuple"; the YAML has lists: `tools: echo` for `tools: [echo]`
        given = error.get("input")
        message = (
            f"should be a list, like [{given}]" if isinstance(given, str) else ("should be a list")
        )
    return f"{path or '<top>'}: {message}"
