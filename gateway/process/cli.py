"""`taskgate run | check | demo | schema | reload | routes | task inspect`: the command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable

from gateway import __version__, build
from gateway.catalog.collisions import collisions
from gateway.catalog.table import RouteTable
from gateway.catalog.templates import TemplateError, compile_template
from gateway.config import (
    ROUTE_KINDS,
    Config,
    ConfigError,
    deprecation_warnings,
    json_schema,
    load_config,
)
from gateway.observe.trace import tracing_warnings
from gateway.store.redis_url import masked


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    alone = _WITHOUT_CONFIG.get(args.command)
    if alone is not None:
        return alone(args)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"taskgate: {exc.source} is not a valid configuration:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    return _WITH_CONFIG[args.command](config, args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taskgate", description=__doc__)
    parser.add_argument(
        "--version",
        action="version",
        version=f"taskgate {__version__}, {build()}",
        help="the version, and which build runs: compiled with mypyc or pure Python",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("run", help="serve MCP traffic with a configuration file")
    serve_cmd.add_argument("--config", required=True, help="YAML configuration file")
    serve_cmd.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    serve_cmd.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes sharing the listener (SO_REUSEPORT); each has its own caches",
    )
    check = commands.add_parser("check", help="validate a configuration and print its routes")
    check.add_argument("--config", required=True)
    check.add_argument(
        "--discover",
        action="store_true",
        help="also ask the backends what they serve, and warn of items routes shadow or that "
        "two backends serve",
    )
    demo = commands.add_parser("demo", help="two demo backends behind taskgate, on loopback")
    demo.add_argument("--port", type=int, default=8080, help="taskgate's port (default 8080)")
    demo.add_argument(
        "--backend-ports",
        type=lambda text: [int(p) for p in text.split(",")],
        help="ports of the demo replicas, comma-separated (default: those in config/demo.yaml)",
    )
    commands.add_parser("schema", help="print the configuration's JSON Schema")
    _add_operator_commands(commands)
    return parser


def _add_operator_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """reload, routes and task inspect: the commands that look at a running or stored taskgate."""
    reload = commands.add_parser(
        "reload",
        help="ask a running taskgate (through its admin listener) to reload its configuration",
    )
    reload.add_argument("--config", required=True, help="the file the running taskgate serves")
    reload.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the answer (default 30)"
    )
    routes = commands.add_parser(
        "routes", help="print the compiled route table: kind, pattern, backend, tenants, scopes"
    )
    routes.add_argument("--config", required=True)
    routes.add_argument(
        "--discover",
        action="store_true",
        help="also ask the backends what they serve, to name the items each route shadows",
    )
    task = commands.add_parser("task", help="operator's look at one task route")
    task_commands = task.add_subparsers(dest="task_command", required=True)
    inspect = task_commands.add_parser(
        "inspect", help="where a task lives and who owns it: its route, from the store"
    )
    inspect.add_argument("task_id", metavar="ID")
    inspect.add_argument("--config", required=True)
    inspect.add_argument(
        "--admin",
        action="store_true",
        help="ask the running taskgate's admin listener instead of reading the store",
    )


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(), indent=2, sort_keys=True))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from gateway.process.demo import run_demo

    return run_demo(args.port, args.backend_ports)


def _check(config: Config, args: argparse.Namespace) -> int:
    try:
        print(describe(config, args.config), flush=True)
    except BrokenPipeError:
        # `taskgate check | head`: the reader left; say nothing more, and no traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    warnings = (
        collisions(config.routes)
        + template_warnings(config)
        + secret_warnings(config)
        + tracing_warnings(config)
        + deprecation_warnings(config)
    )
    code = 0
    if args.discover:
        from gateway.ops.inspect import discovered

        found, silent, eras = asyncio.run(discovered(config))
        print("what each replica speaks", *(f"  {line}" for line in eras), sep="\n", flush=True)
        warnings += found + [f"backend {name!r} did not answer discovery" for name in silent]
        code = 1 if silent else 0
    for warning in warnings:
        print(f"taskgate: warning: {warning}", file=sys.stderr)
    return code


def _reload(config: Config, args: argparse.Namespace) -> int:
    from gateway.ops.reload_command import reload_command

    return reload_command(config, args)


def _routes(config: Config, args: argparse.Namespace) -> int:
    from gateway.ops.inspect import routes_command

    return routes_command(config, args)


def _task(config: Config, args: argparse.Namespace) -> int:
    from gateway.ops.inspect_task import task_command

    return task_command(config, args)


def _run(config: Config, args: argparse.Namespace) -> int:
    from gateway.process.workers import run_taskgate

    return run_taskgate(config, workers=args.workers, log_level=args.log_level, path=args.config)


# Each subcommand's function; those of the second table get the validated --config file.
_WITHOUT_CONFIG: dict[str, Callable[[argparse.Namespace], int]] = {
    "schema": _schema,
    "demo": _demo,
}
_WITH_CONFIG: dict[str, Callable[[Config, argparse.Namespace], int]] = {
    "run": _run,
    "check": _check,
    "reload": _reload,
    "routes": _routes,
    "task": _task,
}


def secret_warnings(config: Config) -> list[str]:
    """Key files and token sources `run` would fail on, named as the YAML names them: `check`
    validates the file, not the machine, so these are warnings."""
    found: list[str] = []
    for k, key in enumerate(config.auth.keys):
        if key.file is not None and not os.path.isfile(key.file):
            found.append(f"auth.keys[{k}].file: {key.file} does not exist (run will not start)")
        if key.secret_env is not None and not os.environ.get(key.secret_env):
            found.append(
                f"auth.keys[{k}].secret_env: ${key.secret_env} is not set here (run will not start)"
            )
    for name, backend in config.backends.items():
        auth = backend.upstream_auth
        if auth is None:
            continue
        if auth.bearer_env is not None and not os.environ.get(auth.bearer_env):
            found.append(
                f"backends.{name}.upstream_auth.bearer_env: ${auth.bearer_env} is not set here "
                "(run will not start)"
            )
        if auth.bearer_file is not None and not os.path.isfile(auth.bearer_file):
            found.append(
                f"backends.{name}.upstream_auth.bearer_file: {auth.bearer_file} does not exist "
                "(run will not start)"
            )
    return found


def template_warnings(config: Config) -> list[str]:
    """Resource templates the URI matcher refuses: resources/read reaches nothing through them
    (gateway/catalog/templates.py says what it understands)."""
    found: list[str] = []
    for r, route in enumerate(config.routes):
        for k, template in enumerate(route.resource_templates):
            try:
                compile_template(template)
            except TemplateError as exc:
                found.append(
                    f"routes[{r}].resource_templates[{k}] {template!r}: {exc}; resources/read "
                    "reaches no URI through it (completion/complete and the list still do)"
                )
    return found


def describe(config: Config, source: str) -> str:
    """What `check` prints: the listener, the store, the backends and the compiled routes
    (tools unlabelled, as ever; other kinds by their YAML key)."""
    listen = config.listen
    lines = [
        f"{source}: OK",
        f"listen   http://{listen.host}:{listen.port}{listen.path}"
        + ("  (strict headers)" if listen.strict_headers else ""),
        f"store    {masked(config.store.url)}",
        f"auth     {_describe_auth(config)}",
        "backends",
    ]
    for name, backend in config.backends.items():
        lines.append(f"  {name}  timeout {backend.timeout_s:g}s  era {backend.era}")
        lines.extend(f"    {url}" for url in backend.replicas)
    lines.append("routes (first match wins)")
    for route in RouteTable(config.routes).routes:
        limits = "".join(
            [
                f"  tenants: {', '.join(sorted(route.tenants))}" if route.tenants else "",
                f"  scopes: {' '.join(route.scopes)}" if route.scopes else "",
            ]
        )
        items = [", ".join(route.tools)] if route.tools else []
        items += [
            f"{kind}: {', '.join(getattr(route, kind))}"
            for kind in ROUTE_KINDS
            if kind != "tools" and getattr(route, kind)
        ]
        lines.append(f"  [{route.index}] {'  '.join(items)} -> {route.backend}{limits}")
    return "\n".join(lines)


def _describe_auth(config: Config) -> str:
    auth = config.auth
    if auth.mode == "none":
        return "none (anonymous; development on loopback only)"
    keys = auth.jwks_url or f"{len(auth.keys)} configured key(s)"
    return (
        f"jwt  issuer {auth.issuer}  audience {auth.audience}  keys {keys}  "
        f"algorithms {', '.join(auth.algorithms)}  tasks shared per {auth.task_sharing}"
    )


if __name__ == "__main__":
    sys.exit(main())
