"""What `mypy --strict` accepts and mypyc compiles wrongly, kept out of taskgate's sources (issue
17; docs/performance.md, "Two builds"). Each rule is a pitfall a trial build hit on an error
path only (a failed connection, a store outage): caught here, in every build, it fails a test
instead of a user. The suite also runs on the compiled build itself (make test), which is what
catches what no rule names.
"""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import subprocess
import sys
import tomllib
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import gateway
from gateway import _build
from gateway.errors import GatewayError
from gateway.protocol.codes import ProtocolError

ROOT = Path(__file__).resolve().parents[2]


def compiled_sources() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    hook = config["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["mypyc"]
    return list(hook["include"])


def module_name(source: str) -> str:
    return source.removesuffix(".py").replace("/", ".")


def trees(sources: list[str]) -> list[tuple[str, ast.Module]]:
    return [(source, ast.parse((ROOT / source).read_text(encoding="utf-8"))) for source in sources]


def all_sources() -> list[str]:
    return sorted(str(path.relative_to(ROOT)) for path in (ROOT / "gateway").rglob("*.py"))


def test_the_compiled_list_names_sources_that_exist() -> None:
    sources = compiled_sources()
    assert sources
    assert len(set(sources)) == len(sources)
    for source in sources:
        assert (ROOT / source).is_file(), source


def test_no_two_except_clauses_of_one_try_bind_one_name() -> None:
    """Compiled, the second clause's `as exc` is typed as the first's exception class: a
    TypeError instead of the error taskgate meant to answer (an HTTP 500)."""
    found = []
    for source, tree in trees(all_sources()):
        for node in ast.walk(tree):
            if isinstance(node, ast.Try | ast.TryStar):
                names = [handler.name for handler in node.handlers if handler.name]
                repeated = sorted({name for name in names if names.count(name) > 1})
                if repeated:
                    found.append(f"{source}:{node.lineno}: {', '.join(repeated)}")
    assert not found, "rename so that each clause binds its own name:\n" + "\n".join(found)


def test_no_async_generator_in_a_compiled_module() -> None:
    """mypyc compiles no async generators: an async iterator class instead."""
    found = [
        f"{source}:{node.lineno}: {node.name}"
        for source, tree in trees(compiled_sources())
        for node in ast.walk(tree)
        if isinstance(node, ast.AsyncFunctionDef)
        and any(
            isinstance(inner, ast.Yield | ast.YieldFrom)
            for inner in ast.walk(node)
            if _enclosing_function(node, inner) is node
        )
    ]
    assert not found, found


def test_no_local_first_bound_in_a_try_is_read_by_its_handlers_or_finally() -> None:
    """A local assigned inside `try` and read in `finally` (or an `except`) may be unbound or
    None there; compiled, a narrowed `X | None` is checked against X and raises TypeError
    exactly when the call failed. Bind it before the `try`, or restructure."""
    found = []
    for source, tree in trees(compiled_sources()):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Try):
                continue
            bound = {
                name.id
                for statement in node.body
                for name in ast.walk(statement)
                if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Store)
            }
            after = [*node.finalbody, *(s for h in node.handlers for s in h.body)]
            read = {
                name.id
                for statement in after
                for name in ast.walk(statement)
                if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Load)
            }
            if bound & read:
                found.append(f"{source}:{node.lineno}: {', '.join(sorted(bound & read))}")
    assert not found, found


def test_no_error_class_of_a_compiled_module_carries_class_level_defaults() -> None:
    """Compiled, an exception class's class-level `code` or `status` is lost (a trial build
    answered a 400 as a 500, -32602 as -32603, and an EnvelopeError had no `code` at all):
    every GatewayError is defined in gateway/errors.py and every ProtocolError in
    gateway/protocol/codes.py, neither compiled; an exception class of a compiled module
    assigns nothing in its class body."""
    sources = compiled_sources()
    compiled = {module_name(source) for source in sources}
    assert not {"gateway.errors", "gateway.protocol.codes"} & compiled
    for info in pkgutil.walk_packages(gateway.__path__, "gateway."):
        if not info.name.endswith("__main__"):  # which would run the command line
            importlib.import_module(info.name)
    stack: list[type] = [GatewayError, ProtocolError]
    offenders = []
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls.__module__ in compiled:
            offenders.append(f"{cls.__module__}.{cls.__qualname__}")
    for source, tree in trees(sources):
        module = importlib.import_module(module_name(source))
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            defined = getattr(module, node.name, None)
            is_error = isinstance(defined, type) and issubclass(defined, BaseException)
            assigns = any(isinstance(item, ast.Assign | ast.AnnAssign) for item in node.body)
            if is_error and assigns:
                offenders.append(f"{source}:{node.lineno}: {node.name}")
    assert not offenders, offenders


def test_error_classes_keep_their_codes_and_statuses() -> None:
    """The classes both builds answer with, by behaviour: what each one says on the wire."""
    from gateway.errors import (
        BadGateway,
        HTTPRefusal,
        Overloaded,
        TaskNotFound,
        UnsafeHeader,
        from_protocol,
    )
    from gateway.protocol.codes import (
        CapabilityError,
        EnvelopeError,
        HeaderError,
        MetaError,
        MethodError,
        VersionError,
    )

    assert (TaskNotFound(1).status, TaskNotFound(1).code) == (200, -32602)
    assert (UnsafeHeader("x").status, UnsafeHeader("x").code) == (400, -32600)
    assert (Overloaded("x").status, Overloaded("x").code) == (503, -32603)
    assert (BadGateway("x").status, HTTPRefusal("x").code) == (502, -32600)
    expected: list[tuple[type[ProtocolError], int, int]] = [
        (EnvelopeError, 400, -32600),
        (MetaError, 400, -32602),
        (VersionError, 400, -32022),
        (HeaderError, 400, -32020),
        (MethodError, 404, -32601),
        (CapabilityError, 400, -32021),
    ]
    for cls, status, code in expected:
        answer = from_protocol(cls("x"))
        assert (answer.status, answer.code) == (status, code), cls.__name__


def test_the_build_that_runs_is_the_one_asked_for() -> None:
    """TASKGATE_PURE=1 runs the pure build even beside compiled files; without it, compiled
    files beside the witness module are what runs. `taskgate --version` says which."""
    witness = ROOT / "gateway" / "h1"
    beside = any(witness.glob(f"server{suffix}") for suffix in EXTENSION_SUFFIXES)
    pure = os.environ.get("TASKGATE_PURE", "") not in ("", "0")
    assert _build.compiled() is (beside and not pure)
    said = subprocess.run(
        [sys.executable, "-m", "gateway", "--version"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert ("compiled with mypyc" in said) is (beside and not pure), said
    forced = subprocess.run(
        [sys.executable, "-m", "gateway", "--version"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "TASKGATE_PURE": "1"},
    ).stdout
    assert "pure Python" in forced, forced


def _enclosing_function(outer: ast.AST, inner: ast.AST) -> ast.AST | None:
    """The innermost function of `outer` that holds `inner` (a yield in a nested function is
    that function's)."""
    found: ast.AST | None = None

    def visit(node: ast.AST, current: ast.AST | None) -> None:
        nonlocal found
        if node is inner:
            found = current
            return
        here = (
            node
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            else current
        )
        for child in ast.iter_child_nodes(node):
            visit(child, here)

    visit(outer, None)
    return found


def test_the_compiler_checks_what_the_type_checker_checks() -> None:
    """mypyc.ini (read by hatch-mypyc, which hides pyproject.toml, and by scripts/compile.py)
    holds pyproject.toml's [tool.mypy] settings: code compiles under the rules it was checked
    with, pydantic's plugin included."""
    import configparser

    ini = configparser.ConfigParser()
    ini.read(ROOT / "mypyc.ini")
    checked = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    compiling = ini["mypy"]
    assert compiling.getboolean("strict") is checked["strict"]
    assert compiling["python_version"] == checked["python_version"]
    assert compiling.getboolean("explicit_package_bases") is checked["explicit_package_bases"]
    assert [p.strip() for p in compiling["plugins"].split(",")] == checked["plugins"]
    ignored = [o for o in checked["overrides"] if o.get("ignore_missing_imports")]
    modules = {m for o in ignored for m in o["module"]}
    sections = [s for s in ini.sections() if s.startswith("mypy-")]
    assert {m for s in sections for m in s.removeprefix("mypy-").split(",")} == modules
    assert all(ini[s].getboolean("ignore_missing_imports") for s in sections)
