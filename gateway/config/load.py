"""Reading a configuration file: YAML that refuses duplicate keys, validation, cross-checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.config.errors import ConfigError, is_echo, problem_of
from gateway.config.root import Config, cross_check, unknown_backends
from gateway.config.store import sqlite_path


def load_config(path: str | Path) -> Config:
    """Read, validate and cross-check a YAML file; relative file paths in it (a sqlite store,
    key files, token files) name files beside it, whatever the working directory."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as unreadable:
        raise ConfigError(source, [f"cannot read: {unreadable.strerror}"]) from None
    except UnicodeDecodeError as undecodable:
        raise ConfigError(source, [f"not UTF-8 text (byte {undecodable.start})"]) from None
    # The folder resolved, not the file: a file that is a link (a Kubernetes ConfigMap's is)
    # still has its neighbours where it is linked from.
    return _beside(parse_config(text, source=source), Path(path).absolute().parent.resolve())


def _beside(config: Config, folder: Path) -> Config:
    """`config` with its relative file paths made absolute under `folder`.

    A configuration is written next to its files: `taskgate run` started by systemd, a
    container or another shell must find the same key and database as `taskgate check` run
    where the file is. Absolute paths and sqlite:///:memory: are left as they are.
    """

    def rebased(file: str) -> str:
        return file if Path(file).is_absolute() else str(folder / file)  # pathlib drops "./"

    update: dict[str, Any] = {}
    store = sqlite_path(config.store.url) if config.store.url.startswith("sqlite:") else None
    if store is not None and store != ":memory:" and not Path(store).is_absolute():
        url = f"sqlite:///{rebased(store)}"
        update["store"] = config.store.model_copy(update={"url": url})
    tls = config.store.tls
    if tls is not None:
        files = {
            key: rebased(file)
            for key in ("ca_file", "cert_file", "key_file")
            if (file := getattr(tls, key)) is not None
        }
        store_update = {"tls": tls.model_copy(update=files)}
        update["store"] = update.get("store", config.store).model_copy(update=store_update)
    if any(key.file is not None for key in config.auth.keys):
        keys = tuple(
            key if key.file is None else key.model_copy(update={"file": rebased(key.file)})
            for key in config.auth.keys
        )
        update["auth"] = config.auth.model_copy(update={"keys": keys})
    backends = dict(config.backends)
    for name, backend in config.backends.items():
        auth = backend.upstream_auth
        if auth is not None and auth.bearer_file is not None:
            auth = auth.model_copy(update={"bearer_file": rebased(auth.bearer_file)})
            backends[name] = backend.model_copy(update={"upstream_auth": auth})
    if backends != config.backends:
        update["backends"] = backends
    return config.model_copy(update=update) if update else config


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping instead of keeping the last.

    PyYAML silently keeps the last value, so a second `routes:` block would drop the first.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<: *anchor" keys may be overridden, which is their point
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key; construct_mapping reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_config(text: str, *, source: str = "<config>") -> Config:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise ConfigError(
            source, [f"{where}invalid YAML: {getattr(exc, 'problem', exc)}"]
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(source, ["the top level must be a mapping"])
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        problems = [problem_of(error) for error in errors if not is_echo(error, errors)]
        raise ConfigError(source, problems + unknown_backends(data)) from None
    problems = cross_check(config)
    if problems:
        raise ConfigError(source, problems)
    return config
