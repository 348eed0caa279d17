"""JWT on every request: 401 that points to the metadata, tenants see their routes, scopes
authorize, tasks belong to their creator, the client's token never goes upstream, and a backend
hears the identity taskgate verified or nothing."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from cryptography.hazmat.primitives import serialization

from gateway.config import Config, ConfigError, parse_config
from gateway.errors import StartupError
from tests.gateway.conftest import EchoUpstream
from tests.gateway.test_limits import from_file, written
from tests.support.attacks import claims_of, json_pairs, signed_by_hand
from tests.support.echo_upstream import SEEN
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import AUDIENCE, ISSUER, Issuer, jwt_auth
from tests.support.legacy import LegacyClient
from tests.support.listen import listening, next_event
from tests.support.mcp import JsonObject, build_request, poll_until, post_raw
from tests.support.procs import BackendProcess

ids = itertools.count(40_000)
METADATA_URL = "https://gateway.test/.well-known/oauth-protected-resource/mcp"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def call(
    http: aiohttp.ClientSession, url: str, token: str | None, method: str, params: dict[str, Any]
) -> Any:
    headers = bearer(token) if token else {}
    return await post_raw(http, url, build_request(method, params, id=next(ids)), headers=headers)


def tenant_config(issuer: Issuer, backends: list[BackendProcess], **auth: Any) -> Config:
    urls = [b.url for b in backends]
    return Config.model_validate(
        {
            "listen": {"host": "127.0.0.1", "port": 0},
            "store": {"url": "sqlite:///:memory:"},
            "auth": jwt_auth(issuer, **auth),
            "backends": {"reports": {"replicas": urls}, "acme-only": {"replicas": urls}},
            "routes": [
                {"tools": ["whoami"], "backend": "acme-only", "tenants": ["acme"]},
                {"tools": ["generate_report"], "backend": "reports", "scopes": ["reports"]},
                {"tools": ["echo"], "backend": "reports"},
            ],
        }
    )


async def test_no_token_is_401_pointing_to_the_resource_metadata(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    async with serving(tenant_config(issuer, report_backends)) as gateway:
        for answer in (
            await call(http, gateway.url, None, "tools/list", {}),
            await post_raw(http, gateway.url, b"not even json"),
        ):
            assert answer.status == 401
            assert (
                answer.headers["WWW-Authenticate"] == f'Bearer resource_metadata="{METADATA_URL}"'
            )
            assert answer.message["error"]["code"] == -32600
            assert answer.message["id"] is None
        async with http.get(gateway.url) as response:  # even GET learns nothing but 401
            assert response.status == 401


async def test_the_resource_metadata_is_served_at_both_well_known_paths(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    async with serving(tenant_config(issuer, report_backends)) as gateway:
        base = gateway.url.removesuffix("/mcp")
        for path in (
            "/.well-known/oauth-protected-resource",
            "/.well-known/oauth-protected-resource/mcp",
        ):
            async with http.get(base + path) as response:
                assert response.status == 200
                assert await response.json() == {
                    "resource": AUDIENCE,
                    "authorization_servers": [ISSUER],
                    "scopes_supported": ["tasks", "reports"],
                    "bearer_methods_supported": ["header"],
                }
            async with http.head(base + path) as response:
                assert response.status == 200
                assert await response.read() == b""
            async with http.post(base + path) as response:
                assert response.status == 404


async def test_a_route_of_another_tenant_is_hidden_and_answers_like_an_unknown_tool(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    async with serving(tenant_config(issuer, report_backends)) as gateway:
        acme, globex = issuer.token("acme", "alice"), issuer.token("globex", "gina")
        listed = await call(http, gateway.url, acme, "tools/list", {})
        assert "whoami" in [t["name"] for t in listed.message["result"]["tools"]]
        listed = await call(http, gateway.url, globex, "tools/list", {})
        assert "whoami" not in [t["name"] for t in listed.message["result"]["tools"]]
        hidden = await call(
            http, gateway.url, globex, "tools/call", {"name": "whoami", "arguments": {}}
        )
        missing = await call(
            http, gateway.url, globex, "tools/call", {"name": "nowhere", "arguments": {}}
        )
        assert hidden.status == missing.status == 200
        assert hidden.message["error"] == {"code": -32602, "message": "Unknown tool: whoami"}
        assert missing.message["error"] == {"code": -32602, "message": "Unknown tool: nowhere"}
        allowed = await call(
            http, gateway.url, acme, "tools/call", {"name": "whoami", "arguments": {}}
        )
        assert allowed.message["result"]["structuredContent"]["replica"] in ("r1", "r2")


async def test_a_visible_tool_whose_scopes_the_token_lacks_is_403_insufficient_scope(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    async with serving(tenant_config(issuer, report_backends)) as gateway:
        params = {"name": "generate_report", "arguments": {"size": "s"}}
        weak = await call(http, gateway.url, issuer.token(scopes=("tasks",)), "tools/call", params)
        assert weak.status == 403
        assert weak.headers["WWW-Authenticate"] == (
            'Bearer error="insufficient_scope", scope="reports", '
            f'resource_metadata="{METADATA_URL}"'
        )
        assert weak.message["error"]["code"] == -32600
        strong = await call(
            http, gateway.url, issuer.token(scopes=("reports",)), "tools/call", params
        )
        assert strong.status == 200
        assert strong.message["result"]["resultType"] == "task"


async def test_scopes_may_come_as_an_scp_list(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    async with serving(tenant_config(issuer, report_backends)) as gateway:
        params = {"name": "generate_report", "arguments": {"size": "s"}}
        token = issuer.token(scp=["reports", "tasks"])
        assert (await call(http, gateway.url, token, "tools/call", params)).status == 200


async def create_task(http: aiohttp.ClientSession, url: str, token: str) -> str:
    params = {"name": "generate_report", "arguments": {"size": "s"}}
    answer = await call(http, url, token, "tools/call", params)
    assert answer.status == 200, answer.message
    return str(answer.message["result"]["taskId"])


async def test_a_task_is_its_creators_and_tenant_sharing_opens_it_to_the_tenant(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    alice = issuer.token("acme", "alice", scopes=("reports",))
    bob = issuer.token("acme", "bob", scopes=("reports",))
    for sharing, bob_sees_it in (("principal", False), ("tenant", True)):
        config = tenant_config(issuer, report_backends, task_sharing=sharing)
        async with serving(config) as gateway:
            task_id = await create_task(http, gateway.url, alice)
            mine = await call(http, gateway.url, alice, "tasks/get", {"taskId": task_id})
            assert mine.message["result"]["taskId"] == task_id
            route = await gateway.state.tasks.store.lookup(task_id)
            assert route is not None
            assert (route.tenant, route.principal) == ("acme", "alice")
            theirs = await call(http, gateway.url, bob, "tasks/get", {"taskId": task_id})
            assert ("result" in theirs.message) is bob_sees_it
            if not bob_sees_it:
                assert theirs.message["error"] == {"code": -32602, "message": "Task not found"}


async def test_a_rotated_key_is_fetched_when_a_token_names_it(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    async with serving(tenant_config(issuer, report_backends)) as gateway:
        before = await call(http, gateway.url, issuer.token(), "tools/list", {})
        assert before.status == 200
        fetches = issuer.fetches
        issuer.rotate("RS256")
        after = await call(http, gateway.url, issuer.token(), "tools/list", {})
        assert after.status == 200
        assert issuer.fetches == fetches + 1
        # A made-up kid refetches at most once per jwks_min_refresh_s (0 here), and fails.
        unknown = issuer.token(headers={"kid": "never-published"})
        assert (await call(http, gateway.url, unknown, "tools/list", {})).status == 401


async def test_the_clients_token_never_goes_upstream_but_taskgates_own_credential_does(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    echo_upstream: EchoUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TASKGATE_TEST_UPSTREAM_TOKEN", "taskgates-own")
    options = {
        "upstream_auth": {"bearer_env": "TASKGATE_TEST_UPSTREAM_TOKEN"},
        "identity_headers": {"tenant": "X-Tenant", "principal": "X-Principal"},
    }
    config = gateway_config(
        {"echo": [echo_upstream.url]},
        [(["*"], "echo")],
        backend_options={"echo": options},
        auth=jwt_auth(issuer),
    )
    async with serving(config) as gateway:
        token = issuer.token("acme", "alice")
        headers = {**bearer(token), "X-Tenant": "globex", "X-Principal": "mallory"}
        body = build_request("tools/call", {"name": "headers", "arguments": {}}, id=1)
        answer = await post_raw(http, gateway.url, body, headers=headers)
        assert answer.status == 200
    for seen in echo_upstream.app[SEEN]:  # discovery and the call alike
        sent = {k.lower(): v for k, v in seen["headers"]}
        assert sent["authorization"] == "Bearer taskgates-own"
        assert token not in orjson.dumps(seen["headers"]).decode()
    last = {k.lower(): v for k, v in echo_upstream.app[SEEN][-1]["headers"]}
    assert (last["x-tenant"], last["x-principal"]) == ("acme", "alice")


def identity_config(issuer: Issuer, upstream: EchoUpstream) -> Config:
    """taskgate in front of the echo upstream, sending the verified caller as X-Tenant and
    X-Principal, as a backend that trusts identity headers is configured."""
    return gateway_config(
        {"echo": [upstream.url]},
        [(["*"], "echo")],
        backend_options={
            "echo": {"identity_headers": {"tenant": "X-Tenant", "principal": "X-Principal"}}
        },
        auth=jwt_auth(issuer),
    )


def identities_seen(upstream: EchoUpstream) -> list[tuple[str, str | None, str | None]]:
    """(method, X-Tenant, X-Principal) of every request but the catalogue's own that reached
    the upstream."""
    seen = []
    for received in upstream.app[SEEN]:
        method = orjson.loads(received["body"])["method"]
        if method not in ("server/discover", "tools/list"):
            headers = {k.lower(): v for k, v in received["headers"]}
            seen.append((method, headers.get("x-tenant"), headers.get("x-principal")))
    return seen


def refusals_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "taskgate.auth"]


INVALID_TOKEN = f'Bearer error="invalid_token", resource_metadata="{METADATA_URL}"'
WHITESPACE = "has leading or trailing whitespace"
CONTROL = "holds a control character"
# Identities a backend would read as another one (an HTTP header writer strips the whitespace
# around a value: " acme" arrives as "acme") or refuse (control characters), so that taskgate
# and the backend would disagree on who calls.
UNSENDABLE = {
    "tenant ' acme'": ("tenant", " acme", WHITESPACE),
    "tenant 'acme '": ("tenant", "acme ", WHITESPACE),
    "tenant '\\tacme'": ("tenant", "\tacme", WHITESPACE),
    "tenant with a vertical tab": ("tenant", "ac\x0bme", CONTROL),
    "tenant with DEL": ("tenant", "acme\x7f", CONTROL),
    "tenant with a C1 control": ("tenant", "ac\x9bme", CONTROL),
    "tenant with CR LF and a header": ("tenant", "acme\r\nX-Injected: 1", CONTROL),
    "tenant with NUL": ("tenant", "ac\x00me", CONTROL),
    "subject ' alice'": ("sub", " alice", WHITESPACE),
    "subject 'alice '": ("sub", "alice ", WHITESPACE),
    "subject '\\talice'": ("sub", "\talice", WHITESPACE),
    "subject with a vertical tab": ("sub", "al\x0bice", CONTROL),
    "subject with DEL": ("sub", "alice\x7f", CONTROL),
}


@pytest.mark.parametrize(
    ("claim", "value", "problem"), list(UNSENDABLE.values()), ids=list(UNSENDABLE.keys())
)
async def test_an_identity_the_backend_would_read_otherwise_is_refused_before_it(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    echo_upstream: EchoUpstream,
    caplog: pytest.LogCaptureFixture,
    claim: str,
    value: str,
    problem: str,
) -> None:
    identity: dict[str, Any] = {"tenant": "acme", "subject": "alice"} | {claim: value}
    token = issuer.token(**identity)
    assert claims_of(token)[claim] == value
    params = {"name": "headers", "arguments": {}}
    async with serving(identity_config(issuer, echo_upstream)) as gateway:
        with caplog.at_level(logging.INFO, logger="taskgate.auth"):
            refused = await call(http, gateway.url, token, "tools/call", params)
        assert refused.status == 401, (refused.status, identities_seen(echo_upstream))
        assert refused.headers["WWW-Authenticate"] == INVALID_TOKEN
        assert refusals_logged(caplog) == [
            f"refused a bearer token: the token's {claim!r} claim {problem}"
        ]
        assert identities_seen(echo_upstream) == []
        # The backend hears from taskgate exactly the identity taskgate checked.
        good = await call(http, gateway.url, issuer.token("ac me", "alice"), "tools/call", params)
        assert good.status == 200, good.message
    assert identities_seen(echo_upstream) == [("tools/call", "ac me", "alice")]


def repeating_tenant(issuer: Issuer) -> str:
    """A token its issuer signed whose payload names the tenant twice: globex, then acme."""
    claims = [(k, v) for k, v in claims_of(issuer.token("acme", "alice")).items() if k != "tenant"]
    payload = json_pairs([("tenant", "globex"), *claims, ("tenant", "acme")])
    key = issuer.keys[0]
    header = json_pairs([("alg", key.alg), ("kid", key.kid), ("typ", "JWT")])
    return signed_by_hand(key, header, payload)


async def test_a_token_that_names_its_tenant_twice_reaches_no_backend(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    echo_upstream: EchoUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # pyjwt kept the last copy (acme); a backend or auditor reading the token keeps the first.
    params = {"name": "headers", "arguments": {}}
    async with serving(identity_config(issuer, echo_upstream)) as gateway:
        with caplog.at_level(logging.INFO, logger="taskgate.auth"):
            refused = await call(http, gateway.url, repeating_tenant(issuer), "tools/call", params)
        assert refused.status == 401, (refused.status, identities_seen(echo_upstream))
        assert refused.headers["WWW-Authenticate"] == INVALID_TOKEN
        assert refusals_logged(caplog) == [
            "refused a bearer token: malformed token: the payload repeats the key 'tenant'"
        ]
        assert identities_seen(echo_upstream) == []


async def _modern_call(http: aiohttp.ClientSession, gateway: RunningGateway, token: str) -> int:
    params = {"name": "headers", "arguments": {}}
    status: int = (await call(http, gateway.url, token, "tools/call", params)).status
    return status


async def _front_door_2025(http: aiohttp.ClientSession, gateway: RunningGateway, token: str) -> int:
    client = LegacyClient(http, gateway.url, token=token, version="2025-06-18")
    opened = await client.initialize()
    if opened.status != 200:
        return opened.status
    return (await client.request("tools/call", {"name": "headers"})).status


async def _listen(http: aiohttp.ClientSession, gateway: RunningGateway, token: str) -> int:
    async with listening(
        http, gateway.url, {"toolsListChanged": True}, id=next(ids), token=token
    ) as stream:
        if stream.status == 200:
            await next_event(stream)  # the acknowledgement: the stream was open
        return stream.status


Attempt = Callable[[aiohttp.ClientSession, RunningGateway, str], Awaitable[int]]
PATHS: dict[str, Attempt] = {
    "tools/call (2026-07-28)": _modern_call,
    "initialize and tools/call (the 2025-era front door)": _front_door_2025,
    "subscriptions/listen": _listen,
}


BAD_TOKENS: dict[str, Callable[[Issuer], str]] = {
    "tenant ' acme'": lambda issuer: issuer.token(" acme", "alice"),
    "subject 'al\\x0bice'": lambda issuer: issuer.token("acme", "al\x0bice"),
    "tenant named twice": repeating_tenant,
}


@pytest.mark.parametrize("token_of", BAD_TOKENS.values(), ids=BAD_TOKENS.keys())
@pytest.mark.parametrize("path", PATHS.values(), ids=PATHS.keys())
async def test_every_path_refuses_such_tokens_at_verification(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    echo_upstream: EchoUpstream,
    path: Attempt,
    token_of: Callable[[Issuer], str],
) -> None:
    async with serving(identity_config(issuer, echo_upstream)) as gateway:
        assert await path(http, gateway, token_of(issuer)) == 401
        assert identities_seen(echo_upstream) == []
        # The path itself is open to a good token.
        assert await path(http, gateway, issuer.token("acme", "alice")) == 200


def test_auth_none_is_refused_unless_taskgate_listens_on_loopback() -> None:
    text = (
        "listen: {host: 10.1.2.3}\nauth: {mode: none}\n"
        "backends: {b: {replicas: ['http://127.0.0.1:1/mcp']}}\n"
        "routes: [{tools: [x], backend: b}]\n"
    )
    with pytest.raises(ConfigError) as refused:
        parse_config(text)
    problems = refused.value.problems
    assert any(p.startswith("auth.mode: none is for local development") for p in problems)


async def test_a_missing_upstream_credential_stops_taskgate_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TASKGATE_NO_SUCH_TOKEN", raising=False)
    missing = {"upstream_auth": {"bearer_env": "TASKGATE_NO_SUCH_TOKEN"}}
    config = gateway_config(
        {"b": ["http://127.0.0.1:1/mcp"]}, [(["*"], "b")], backend_options={"b": missing}
    )
    with pytest.raises(StartupError, match=r"backends\.b\.upstream_auth"):
        async with serving(config):
            pass


async def test_tokens_with_made_up_kids_cannot_flood_the_issuer(
    http: aiohttp.ClientSession, issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    config = tenant_config(issuer, report_backends, jwks_min_refresh_s=60)
    async with serving(config) as gateway:
        assert (await call(http, gateway.url, issuer.token(), "tools/list", {})).status == 200
        fetches = issuer.fetches
        for n in range(20):
            forged = issuer.token(headers={"kid": f"made-up-{n}"})
            assert (await call(http, gateway.url, forged, "tools/list", {})).status == 401
        assert issuer.fetches - fetches <= 1


async def test_keys_may_come_from_pem_files_instead_of_a_jwks_url(
    http: aiohttp.ClientSession,
    issuer: Issuer,
    report_backends: list[BackendProcess],
    tmp_path: Path,
) -> None:
    signing = issuer.keys[0]
    pem = tmp_path / "issuer.pem"
    pem.write_bytes(
        signing.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    keys = [{"kid": signing.kid, "alg": signing.alg, "file": str(pem)}]
    config = tenant_config(issuer, report_backends, jwks_url=None, keys=keys)
    async with serving(config) as gateway:
        fetches = issuer.fetches
        assert (await call(http, gateway.url, issuer.token(), "tools/list", {})).status == 200
        other = issuer.rotate("ES256")  # a key the file does not hold
        assert (
            await call(http, gateway.url, issuer.token(key=other), "tools/list", {})
        ).status == 401
        assert issuer.fetches == fetches  # no JWKS is ever fetched


async def test_a_verified_token_is_refused_once_its_exp_has_passed_though_it_was_cached(
    issuer: Issuer, report_backends: list[BackendProcess]
) -> None:
    # No leeway, so that the token is refused from its exp on (30 s by default). Every request
    # on one kept-alive connection, where taskgate knows the token again by its bytes.
    one = aiohttp.TCPConnector(limit=1)
    config = tenant_config(issuer, report_backends, leeway_s=0)
    async with serving(config) as gateway, aiohttp.ClientSession(connector=one) as http:
        # The issuer's keys are fetched first, so that the short-lived token's first use is quick.
        assert (await call(http, gateway.url, issuer.token(), "tools/list", {})).status == 200
        expires = int(time.time()) + 2  # 1 to 2 s from now
        token = issuer.token(exp=expires)
        # Verified, and so cached, while it is good:
        assert (await call(http, gateway.url, token, "tools/list", {})).status == 200

        async def attempt() -> JsonObject:
            answer = await call(http, gateway.url, token, "tools/list", {})
            return {"status": answer.status, "challenge": answer.headers.get("WWW-Authenticate")}

        refused = await poll_until(attempt, lambda seen: seen["status"] == 401, within=10)
        assert time.time() >= expires
        assert refused["challenge"] == (
            f'Bearer error="invalid_token", resource_metadata="{METADATA_URL}"'
        )


async def test_a_reload_that_changes_auth_is_applied_to_connections_already_open(
    issuer: Issuer, report_backends: list[BackendProcess], tmp_path: Path
) -> None:
    content = tenant_config(issuer, report_backends).model_dump(mode="json", exclude_none=True)
    path = tmp_path / "taskgate.yaml"
    token = issuer.token()
    one = aiohttp.TCPConnector(limit=1)  # the token is sent again and again on one connection
    async with from_file(path, content) as process, aiohttp.ClientSession(connector=one) as http:
        assert process.reloader is not None
        statuses = [(await call(http, process.url, token, "tools/list", {})).status for _ in "ab"]
        assert statuses == [200, 200]
        # ES256 no longer allowed: the token, verified and remembered before, is not valid now.
        written(path, {**content, "auth": {**content["auth"], "algorithms": ["RS256"]}})
        assert (await process.reloader.reload("SIGHUP")).applied
        assert (await call(http, process.url, token, "tools/list", {})).status == 401
        assert (await call(http, process.url, issuer.token(), "tools/list", {})).status == 401


CREDENTIALS = frozenset({"authorization", "cookie", "proxy-authorization"})


def credentials_seen(upstream: EchoUpstream) -> dict[str, list[str]]:
    """For each method that reached the upstream, the credential-like headers it carried."""
    seen: dict[str, list[str]] = {}
    for received in upstream.app[SEEN]:
        method = orjson.loads(received["body"])["method"]
        carried = [f"{k}: {v}" for k, v in received["headers"] if k.lower() in CREDENTIALS]
        seen.setdefault(method, []).extend(carried)
    return seen


@pytest.mark.parametrize("mode", ["jwt", "none"])
async def test_no_task_method_carries_the_clients_authorization_or_cookie_upstream(
    http: aiohttp.ClientSession, issuer: Issuer, echo_upstream: EchoUpstream, mode: str
) -> None:
    # No upstream credential is configured, so anything in Authorization upstream is a leak.
    auth = jwt_auth(issuer) if mode == "jwt" else {"mode": "none"}
    config = gateway_config({"echo": [echo_upstream.url]}, [(["*"], "echo")], auth=auth)
    token = issuer.token("acme", "alice") if mode == "jwt" else "client-secret"
    headers = {**bearer(token), "Cookie": "session=client-cookie"}
    steps: list[tuple[str, dict[str, Any]]] = [
        ("tools/call", {"name": "make_task", "arguments": {"task_id": "t-creds"}}),
        ("tasks/get", {"taskId": "t-creds"}),
        ("tasks/update", {"taskId": "t-creds", "inputResponses": {"k": {"action": "accept"}}}),
        ("tasks/cancel", {"taskId": "t-creds"}),
    ]
    async with serving(config) as gateway:
        for method, params in steps:
            body = build_request(method, params, id=next(ids))
            answer = await post_raw(http, gateway.url, body, headers=headers)
            assert answer.status == 200, answer.message
            assert "result" in answer.message, answer.message
    seen = credentials_seen(echo_upstream)
    assert {method for method, _ in steps} <= set(seen)  # each step did reach the upstream
    leaked = {method: carried for method, carried in seen.items() if carried}
    assert leaked == {}
    headers_seen = [received["headers"] for received in echo_upstream.app[SEEN]]
    assert token not in orjson.dumps(headers_seen).decode()


def task_calls(upstream: EchoUpstream) -> int:
    """How many tasks/* requests reached the upstream."""
    methods = [orjson.loads(seen["body"])["method"] for seen in upstream.app[SEEN]]
    return sum(1 for method in methods if method.startswith("tasks/"))


@pytest.mark.parametrize("sharing", ["principal", "tenant"])
async def test_a_task_is_not_found_for_a_principal_of_another_tenant_whatever_its_subject(
    http: aiohttp.ClientSession, issuer: Issuer, echo_upstream: EchoUpstream, sharing: str
) -> None:
    # Sharing opens a task to its creator's tenant at most: a stranger of another tenant, with
    # the creator's own subject or any other, gets the answer an id that never existed gets.
    auth = jwt_auth(issuer, task_sharing=sharing)
    config = gateway_config({"echo": [echo_upstream.url]}, [(["*"], "echo")], auth=auth)
    owner = issuer.token("acme", "alice")
    strangers = {
        "globex/alice": issuer.token("globex", "alice"),
        "globex/gina": issuer.token("globex", "gina"),
    }
    attempts = [
        ("tasks/get", {}),
        ("tasks/update", {"inputResponses": {"k": {"action": "accept"}}}),
        ("tasks/cancel", {}),
    ]
    async with serving(config) as gateway:
        created = {"name": "make_task", "arguments": {"task_id": "t-acme"}}
        assert (await call(http, gateway.url, owner, "tools/call", created)).status == 200
        relayed_before = task_calls(echo_upstream)
        for who, token in strangers.items():
            for method, params in attempts:
                request_id = next(ids)
                answers = [
                    await post_raw(
                        http,
                        gateway.url,
                        build_request(method, {"taskId": task_id, **params}, id=request_id),
                        headers=bearer(token),
                    )
                    for task_id in ("t-acme", "never-created")
                ]
                foreign, unknown = answers
                assert foreign.message.get("error") == {
                    "code": -32602,
                    "message": "Task not found",
                }, f"{who} {method}: {foreign.message}"
                assert (foreign.status, foreign.raw) == (unknown.status, unknown.raw)
        assert task_calls(echo_upstream) == relayed_before  # no stranger's call was relayed
        # The owner still has it, and (under tenant sharing) so has a peer of its tenant.
        readers = [owner] + ([issuer.token("acme", "bob")] if sharing == "tenant" else [])
        for reader in readers:
            mine = await call(http, gateway.url, reader, "tasks/get", {"taskId": "t-acme"})
            assert mine.message["result"]["taskId"] == "t-acme"
