"""The YAML configuration: shipped files are valid, the schema is current, errors name paths."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from gateway.config import Config, ConfigError, json_schema, load_config, parse_config
from gateway.process.cli import main

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"
SCHEMA_PATH = CONFIG_DIR / "schema.json"
SHIPPED = sorted(CONFIG_DIR.glob("*.yaml"))

MINIMAL = """\
backends:
  reports:
    replicas: ["http://127.0.0.1:9101/mcp"]
routes:
  - tools: ["generate_report"]
    backend: reports
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    return info.value.problems


def schema_validator() -> Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


# --- shipped files ------------------------------------------------------------------------


def test_the_config_directory_ships_yaml_files() -> None:
    assert {path.name for path in SHIPPED} >= {"demo.yaml", "production.example.yaml"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.name)
def test_every_shipped_file_loads(path: Path) -> None:
    assert isinstance(load_config(path), Config)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.name)
def test_every_shipped_file_validates_against_the_schema(path: Path) -> None:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))

    errors = [f"{list(e.absolute_path)}: {e.message}" for e in schema_validator().iter_errors(data)]

    assert errors == []


def test_the_schema_file_is_current() -> None:
    expected = json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"

    assert SCHEMA_PATH.read_text(encoding="utf-8") == expected, (
        "config/schema.json is stale: run make schema"
    )


def test_the_schema_command_prints_the_schema_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0

    assert capsys.readouterr().out == SCHEMA_PATH.read_text(encoding="utf-8"), (
        "config/schema.json is stale: run make schema"
    )


def test_the_schema_refuses_what_the_loader_refuses() -> None:
    data: dict[str, Any] = yaml.safe_load(MINIMAL)
    data["listen"] = {"bogus": 1}

    assert not schema_validator().is_valid(data)
    assert not schema_validator().is_valid({"backends": data["backends"]})  # no routes


def test_defaults_fill_what_a_minimal_file_leaves_out() -> None:
    config = parse_config(MINIMAL)

    assert config.listen.host == "127.0.0.1"
    assert config.listen.path == "/mcp"
    assert config.listen.strict_headers is False
    assert config.auth.mode == "none"
    assert config.backends["reports"].replicas == ("http://127.0.0.1:9101/mcp",)


# --- errors name the YAML path ------------------------------------------------------------


def test_a_route_to_an_unknown_backend_names_the_route() -> None:
    text = MINIMAL + (
        "  - tools: [echo]\n    backend: reports\n  - tools: [report_x]\n    backend: reprots\n"
    )

    assert problems(text) == ["routes[2].backend: unknown backend 'reprots'"]


def test_unknown_backends_are_named_alongside_other_problems() -> None:
    text = "listen:\n  port: -1\n" + MINIMAL + "  - tools: [x]\n    backend: nowhere\n"

    found = problems(text)

    assert "routes[1].backend: unknown backend 'nowhere'" in found
    assert any(problem.startswith("listen.port: ") for problem in found)


def test_an_unknown_key_is_named() -> None:
    assert problems("listen:\n  bogus: 1\n" + MINIMAL) == ["listen.bogus: unknown key"]


def test_an_unknown_top_level_key_is_named() -> None:
    assert problems("rotues: []\n" + MINIMAL) == ["rotues: unknown key"]


@pytest.mark.parametrize(
    "replica",
    ["ftp://10.0.0.1/mcp", "127.0.0.1:9101", "http:///mcp", "http://h/mcp?x=1", "http://h/mcp#f"],
)
def test_a_replica_that_is_not_an_http_url_names_its_backend(replica: str) -> None:
    text = MINIMAL.replace("http://127.0.0.1:9101/mcp", replica)

    found = problems(text)

    assert len(found) == 1
    assert found[0].startswith("backends.reports.replicas: ")


def test_a_replica_url_with_credentials_is_refused_without_echoing_them() -> None:
    text = MINIMAL.replace("http://127.0.0.1:9101/mcp", "http://svc:s3cret@127.0.0.1:9101/mcp")

    (found,) = problems(text)

    assert found.startswith("backends.reports.replicas: ")
    assert "upstream_auth" in found
    assert "s3cret" not in found


def test_duplicate_replicas_are_refused() -> None:
    text = MINIMAL.replace('["http://127.0.0.1:9101/mcp"]', '["http://a/mcp", "http://a/mcp"]')

    assert problems(text)[0].startswith("backends.reports.replicas: ")


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("backends:\n  reports:\n    replicas: ['http://a/mcp']\nroutes: []\n", "routes"),
        ("backends:\n  reports:\n    replicas: ['http://a/mcp']\n", "routes"),
        ("backends: {}\nroutes:\n  - tools: [a]\n    backend: reports\n", "backends"),
        (
            "backends:\n  reports:\n    replicas: []\n" + MINIMAL.split("\n", 3)[3],
            "backends.reports.replicas",
        ),
        (MINIMAL.replace('["generate_report"]', "[]"), "routes[0]"),
        (MINIMAL.replace('["generate_report"]', '["  "]'), "routes[0].tools[0]"),
    ],
)
def test_empty_required_lists_are_named(text: str, path: str) -> None:
    found = problems(text)

    assert any(problem.startswith(f"{path}: ") for problem in found), found


def test_invalid_yaml_names_the_line() -> None:
    text = MINIMAL + "  - tools: [echo\n    backend: reports\n"

    found = problems(text)

    assert len(found) == 1
    assert found[0].startswith("line ")
    line = int(found[0].split(":")[0].removeprefix("line "))
    assert 7 <= line <= len(text.splitlines()) + 1


def test_a_key_given_twice_is_refused_naming_the_line() -> None:
    text = MINIMAL + "routes:\n  - tools: [other]\n    backend: reports\n"

    found = problems(text)

    assert len(found) == 1
    assert found[0].startswith("line 7: ")
    assert "routes" in found[0]


def test_yaml_merge_keys_still_work() -> None:
    text = (
        "backends:\n"
        "  a: &base {replicas: ['http://a/mcp'], timeout_s: 5}\n"
        "  b: {<<: *base, replicas: ['http://b/mcp']}\n"
        "routes:\n  - {tools: [x], backend: b}\n"
    )

    config = parse_config(text)

    assert config.backends["b"].replicas == ("http://b/mcp",)
    assert config.backends["b"].timeout_s == 5


@pytest.mark.parametrize("text", ["", "- a\n", "just a string\n", "42\n"])
def test_the_top_level_must_be_a_mapping(text: str) -> None:
    assert problems(text) == ["the top level must be a mapping"]


def test_a_bad_backend_name_is_named() -> None:
    text = MINIMAL.replace("  reports:", "  'bad name':").replace(
        "backend: reports", "backend: bad name"
    )

    assert problems(text) == ["backends.bad name: backend names use letters, digits, '_', '.', '-'"]


def test_an_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.yaml")

    assert info.value.source == str(tmp_path / "missing.yaml")
    assert info.value.problems[0].startswith("cannot read")


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(MINIMAL.encode() + b"# caf\xe9\n")

    with pytest.raises(ConfigError) as info:
        load_config(path)

    assert info.value.source == str(path)


# --- route kinds: tools, prompts, resources, resource templates ---------------------------

BACKENDS = "backends:\n  reports:\n    replicas: ['http://127.0.0.1:9101/mcp']\nroutes:\n"


def routes_text(*routes: str) -> str:
    return BACKENDS + "".join(f"  - {route}\n" for route in routes)


def test_a_route_may_name_every_kind() -> None:
    config = parse_config(
        routes_text(
            "{tools: [report_*], prompts: [report_*, summarize], resources: ['reports://acme/*'],"
            " resource_templates: ['reports://acme/{id}'], backend: reports, tenants: [acme]}"
        )
    )

    (route,) = config.routes
    assert route.tools == ("report_*",)
    assert route.prompts == ("report_*", "summarize")
    assert route.resources == ("reports://acme/*",)
    assert route.resource_templates == ("reports://acme/{id}",)


@pytest.mark.parametrize(
    "route",
    [
        "{prompts: [summarize], backend: reports}",
        "{resources: ['file:///srv/*'], backend: reports}",
        "{resource_templates: ['reports://{id}'], backend: reports}",
        "{tools: [], prompts: [summarize], backend: reports}",
        "{tools: [echo], prompts: [], resources: [], backend: reports}",
    ],
)
def test_a_route_names_any_one_kind_the_others_may_be_empty_or_absent(route: str) -> None:
    (config,) = parse_config(routes_text(route)).routes

    assert config.backend == "reports"


def test_a_route_with_only_tools_reads_as_before() -> None:
    (route,) = parse_config(MINIMAL).routes

    assert (route.tools, route.prompts, route.resources, route.resource_templates) == (
        ("generate_report",),
        (),
        (),
        (),
    )


@pytest.mark.parametrize(
    "route",
    ["{backend: reports}", "{tools: [], prompts: [], resources: [], backend: reports}"],
)
def test_a_route_naming_nothing_is_refused_naming_the_route(route: str) -> None:
    found = problems(routes_text("{tools: [echo], backend: reports}", route))

    assert (
        "routes[1]: a route names at least one item of tools, prompts, resources, "
        "resource_templates"
    ) in found


@pytest.mark.parametrize(
    ("route", "expected"),
    [
        ("{prompts: [summarize, ''], backend: reports}", "routes[1].prompts[1]: "),
        ("{tools: [echo, ' '], backend: reports}", "routes[1].tools[1]: "),
        (
            "{resources: ['reports://a/*', 'reports/a/*'], backend: reports}",
            "routes[1].resources[1]: 'reports/a/*' is not a URI glob: it starts with a scheme",
        ),
        (
            "{resources: ['reports'], backend: reports}",
            "routes[1].resources[0]: 'reports' is not a URI glob: it starts with a scheme and "
            "':' or with '*'",
        ),
        (
            "{resources: ['*', '?*'], backend: reports}",
            "routes[1].resources[1]: '?*' is not a URI glob",
        ),
        ("{resources: [''], backend: reports}", "routes[1].resources[0]: '' is not a URI glob"),
        (
            "{resource_templates: ['{scheme}://x'], backend: reports}",
            "routes[1].resource_templates[0]: '{scheme}://x' is not a URI template: it starts "
            "with a scheme",
        ),
        (
            "{resource_templates: ['/files/{path}*'], backend: reports}",
            "routes[1].resource_templates[0]: '/files/{path}*' is not a URI template: it starts "
            "with a scheme and ':' or with '*'",
        ),
        (
            "{resource_templates: ['*/{a b}'], backend: reports}",
            "routes[1].resource_templates[0]: '*/{a b}' is not a URI template: an expression "
            "is not like {name}",
        ),
        (
            "{resource_templates: ['reports://{id'], backend: reports}",
            "routes[1].resource_templates[0]: 'reports://{id' is not a URI template: a '{' is "
            "never closed",
        ),
        (
            "{resource_templates: ['reports://id}'], backend: reports}",
            "routes[1].resource_templates[0]: 'reports://id}' is not a URI template: a '}' "
            "closes no '{'",
        ),
        (
            "{resource_templates: ['reports://{}'], backend: reports}",
            "routes[1].resource_templates[0]: 'reports://{}' is not a URI template: an "
            "expression is not like {name}",
        ),
        (
            "{resource_templates: ['reports://{a b}'], backend: reports}",
            "routes[1].resource_templates[0]: 'reports://{a b}' is not a URI template: an "
            "expression is not like {name}",
        ),
        (
            "{resource_templates: ['reports://{{id}}'], backend: reports}",
            "routes[1].resource_templates[0]: 'reports://{{id}}' is not a URI template",
        ),
    ],
)
def test_a_bad_route_item_is_named_by_its_path(route: str, expected: str) -> None:
    found = problems(routes_text("{tools: [echo], backend: reports}", route))

    assert any(problem.startswith(expected) for problem in found), found


@pytest.mark.parametrize(
    "template",
    [
        "reports://acme/{id}",
        "file:///{+path}",
        "search://q{?query,limit}",
        "db://{schema}.{table}/{row*}",
        "mail:{user:8}@example.com{#part}",
        "x:{a.b}{%41}",
    ],
)
def test_rfc_6570_expressions_are_accepted_in_templates(template: str) -> None:
    (route,) = parse_config(
        routes_text(f"{{resource_templates: ['{template}'], backend: reports}}")
    ).routes

    assert route.resource_templates == (template,)


@pytest.mark.parametrize(
    ("kind", "pattern"),
    [
        ("resources", "*"),
        ("resources", "*.csv"),
        ("resources", "db://*"),
        ("resource_templates", "*"),
        ("resource_templates", "db://*"),
        ("resource_templates", "file:///{path}*"),
        ("resource_templates", "*/{id}"),
    ],
)
def test_star_and_globs_are_accepted_for_resources_and_templates(kind: str, pattern: str) -> None:
    (route,) = parse_config(routes_text(f"{{{kind}: ['{pattern}'], backend: reports}}")).routes

    assert getattr(route, kind) == (pattern,)
    # and the schema an editor checks with says so too (the generated one, as `make schema`)
    data = yaml.safe_load(BACKENDS + "  - {tools: [echo], backend: reports}\n")
    data["routes"].append({kind: [pattern], "backend": "reports"})
    assert Draft202012Validator(json_schema()).is_valid(data)


def test_the_schema_refuses_a_uri_glob_without_a_scheme_or_star() -> None:
    data = yaml.safe_load(BACKENDS + "  - {tools: [echo], backend: reports}\n")
    for kind in ("resources", "resource_templates"):
        data["routes"][1:] = [{kind: ["reports/*"], "backend": "reports"}]
        assert not Draft202012Validator(json_schema()).is_valid(data)


def test_the_schema_knows_the_route_kinds() -> None:
    def valid(route: dict[str, Any]) -> bool:
        data = yaml.safe_load(BACKENDS + "  - {tools: [echo], backend: reports}\n")
        data["routes"].append(route)
        return bool(schema_validator().is_valid(data))

    assert valid({"prompts": ["summarize"], "backend": "reports"})
    assert valid({"resources": ["reports://acme/*"], "backend": "reports"})
    assert valid({"resource_templates": ["reports://acme/{id}"], "backend": "reports"})
    assert not valid({"backend": "reports"})
    assert not valid({"tools": [], "prompts": [], "backend": "reports"})
    assert not valid({"prompts": [" "], "backend": "reports"})
    assert not valid({"resources": ["reports/acme/*"], "backend": "reports"})
    assert not valid({"resource_templates": ["reports://acme/{id"], "backend": "reports"})


# --- taskgate check -----------------------------------------------------------------------


def test_check_prints_the_compiled_routes_of_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    demo = CONFIG_DIR / "demo.yaml"

    assert main(["check", "--config", str(demo)]) == 0

    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == f"{demo}: OK"
    assert lines[lines.index("routes (first match wins)") + 1 :] == [
        "  [0] generate_report, report_* -> reports",
        "  [1] echo, whoami, slow_count, stats -> reports",
    ]
    assert "    http://127.0.0.1:9101/mcp" in lines


def test_check_names_the_path_of_each_mistake_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        MINIMAL + "  - tools: [a]\n    backend: reports\n  - tools: [b]\n    backend: reprots\n",
        encoding="utf-8",
    )

    assert main(["check", "--config", str(broken)]) == 1

    out, err = capsys.readouterr()
    assert out == ""
    assert str(broken) in err
    assert "routes[2].backend: unknown backend 'reprots'" in err.splitlines()[1]


def test_check_reports_a_file_that_is_not_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")

    assert main(["check", "--config", str(path)]) == 1
    assert str(path) in capsys.readouterr().err


@pytest.mark.parametrize("page", ["README.md", "docs/configuration.md"])
def test_the_documented_configuration_examples_are_valid(page: str) -> None:
    text = (Path(__file__).resolve().parents[2] / page).read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)
    full = [block for block in blocks if "routes:" in block and "backends:" in block]
    assert full, f"{page} shows a whole configuration"
    for block in full:
        parse_config(block, source=page)


def test_the_admin_listener_needs_its_own_port() -> None:
    text = (
        "listen: {port: 8080}\nadmin: {port: 8080}\n"
        "backends: {b: {replicas: ['http://127.0.0.1:1/mcp']}}\n"
        "routes: [{tools: [x], backend: b}]\n"
    )
    with pytest.raises(ConfigError) as refused:
        parse_config(text)
    assert "admin.port: 8080 is the public listener's port too" in refused.value.problems


def test_check_shows_every_route_kind_and_warns_about_collisions_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "kinds.yaml"
    path.write_text(
        routes_text(
            "{resources: ['data://acme/*'], backend: reports, tenants: [acme]}",
            "{prompts: [summarize], resources: ['data://*'], resource_templates: ['data://{id}'],"
            " backend: reports}",
            "{tools: [echo], prompts: [summarize], backend: reports}",
        ),
        encoding="utf-8",
    )

    assert main(["check", "--config", str(path)]) == 0  # warnings do not fail the check

    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[lines.index("routes (first match wins)") + 1 :] == [
        "  [0] resources: data://acme/* -> reports  tenants: acme",
        "  [1] prompts: summarize  resources: data://*  resource_templates: data://{id} -> reports",
        "  [2] echo  prompts: summarize -> reports",
    ]
    assert err.splitlines() == [
        "taskgate: warning: routes[1].resources[0] 'data://*' would expose to every tenant what "
        "routes[0].resources[0] 'data://acme/*' keeps to tenants acme",
        "taskgate: warning: routes[2].prompts[0] 'summarize' is shadowed: "
        "routes[1].prompts[0] 'summarize' matches it first",
    ]


def test_check_accepts_star_for_every_resource_and_template_and_names_what_it_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "star.yaml"
    path.write_text(
        routes_text("{resources: ['*'], resource_templates: ['*'], backend: reports}"),
        encoding="utf-8",
    )

    assert main(["check", "--config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "  [0] resources: *  resource_templates: * -> reports" in out.splitlines()
    assert err == ""

    path.write_text(
        routes_text(
            "{resources: ['*'], backend: reports}",
            "{resources: [reports], resource_templates: ['files/{path}*'], backend: reports}",
        ),
        encoding="utf-8",
    )
    assert main(["check", "--config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines()[1:] == [
        "  routes[1].resources[0]: 'reports' is not a URI glob: it starts with a scheme and ':' "
        "or with '*'",
        "  routes[1].resource_templates[0]: 'files/{path}*' is not a URI template: it starts "
        "with a scheme and ':' or with '*'",
    ]


def test_a_string_where_a_list_belongs_says_list_and_nothing_else() -> None:
    """Not pydantic's "Input should be a valid tuple", nor its echo that the routes list is
    then too short: one problem, in the words of the YAML."""
    text = (
        "backends:\n  r: {replicas: ['http://127.0.0.1:9/mcp']}\n"
        "routes:\n  - {tools: echo, backend: r}\n"
    )
    assert problems(text) == ["routes[0].tools: should be a list, like [echo]"]


def test_an_empty_routes_list_is_still_too_short() -> None:
    text = "backends:\n  r: {replicas: ['http://127.0.0.1:9/mcp']}\nroutes: []\n"
    (problem,) = problems(text)
    assert problem.startswith("routes: ")
