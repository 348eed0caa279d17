"""Attacks on taskgate's authentication and task ownership, against the real report backends.

1. Other principals' task ids, through every tasks/* method, with and without Mcp-Name, are
   answered byte for byte (status and body, then every header but Date) like ids that never
   existed, and none of those calls reaches a backend: every task still waits for its owner.
2. Broken, forged and misused bearer tokens get 401 with a Bearer challenge that names the
   resource metadata, and the same body as no token at all, on tasks/*, tools/call and
   tools/list; tokens that are merely a little late or early (inside the leeway) still work.
3. Every configured signature algorithm gets a caller through.
"""

from __future__ import annotations

import base64
import functools
import itertools
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import jwt
import pytest

from tests.gateway.conftest import REPORT_TOOLS
from tests.support.attacks import (
    bearer,
    claims_of,
    header_of,
    headers_but_date,
    hs256_by_hand,
    json_pairs,
    public_pem,
    segment,
    send,
    signed_by_hand,
    tampered,
    unsigned,
)
from tests.support.gateway import RunningGateway, gateway_config, serving
from tests.support.issuer import AUDIENCE, Issuer, SigningKey, jwt_auth, new_key, running_issuer
from tests.support.mcp import Answer, JsonObject, build_request, poll_until
from tests.support.procs import BackendProcess

ids = itertools.count(7_000_000)
APPROVE = {"action": "accept", "content": {"approved": True}}
_aud = urlsplit(AUDIENCE)
METADATA_URL = f"{_aud.scheme}://{_aud.netloc}/.well-known/oauth-protected-resource{_aud.path}"


@functools.cache
def rsa_key() -> Any:
    """One RSA private key for the module: generating one per test costs more than the test."""
    return new_key("RS256")


@asynccontextmanager
async def gateway_for(
    issuer: Issuer, backends: list[BackendProcess], **auth: Any
) -> AsyncIterator[RunningGateway]:
    """taskgate in front of both report replicas, trusting `issuer`."""
    config = gateway_config(
        {"reports": [b.url for b in backends]},
        [(REPORT_TOOLS, "reports")],
        auth=jwt_auth(issuer, **auth),
    )
    async with serving(config) as gateway:
        yield gateway


async def call(
    http: aiohttp.ClientSession,
    url: str,
    method: str,
    params: JsonObject,
    *,
    authorization: Sequence[str],
    request_id: int | None = None,
    name_header: bool = True,
) -> Answer:
    body = build_request(method, params, id=next(ids) if request_id is None else request_id)
    return await send(http, url, body, authorization=authorization, name_header=name_header)


def result(answer: Answer) -> JsonObject:
    assert answer.status == 200, (answer.status, answer.raw)
    message = answer.message
    assert "result" in message, message
    found: JsonObject = message["result"]
    return found


async def create_report(http: aiohttp.ClientSession, url: str, token: str) -> str:
    params = {"name": "generate_report", "arguments": {"size": "small"}}
    created = result(await call(http, url, "tools/call", params, authorization=bearer(token)))
    assert created["resultType"] == "task", created
    return str(created["taskId"])


async def get_task(http: aiohttp.ClientSession, url: str, token: str, task_id: str) -> JsonObject:
    task = result(
        await call(http, url, "tasks/get", {"taskId": task_id}, authorization=bearer(token))
    )
    assert task["taskId"] == task_id, task
    return task


async def parked(http: aiohttp.ClientSession, url: str, token: str, task_id: str) -> JsonObject:
    """Poll the task as its owner until it waits for input."""
    return await poll_until(
        lambda: get_task(http, url, token, task_id),
        lambda task: task["status"] == "input_required",
    )


def not_found(request_id: int) -> JsonObject:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {"code": -32602, "message": "Task not found"},
    }


# ---------------------------------------------------------------------------------------------
# 1. Ownership: foreign task ids are unknown task ids


@dataclass(frozen=True)
class Caller:
    tenant: str
    subject: str
    token: str

    def __str__(self) -> str:
        return f"{self.tenant}/{self.subject}"


@dataclass(frozen=True)
class Owned:
    task_id: str
    input_key: str  # the key FastMCP minted for the task's approval request


@dataclass(frozen=True)
class Attempt:
    label: str  # who asked for what, how
    request_id: int
    foreign: Answer
    unknown: Answer


@dataclass
class Matrix:
    attempts: list[Attempt] = field(default_factory=list)
    # Problems outside the pairwise comparison: owners that cannot read, tasks that moved.
    problems: list[str] = field(default_factory=list)


def _attack_params(task_id: str, own_key: str) -> list[tuple[str, str, JsonObject]]:
    return [
        ("tasks/get", "tasks/get", {"taskId": task_id}),
        (
            "tasks/update (guessed key)",
            "tasks/update",
            {"taskId": task_id, "inputResponses": {"k": APPROVE}},
        ),
        (
            # The key the owner saw: were this update relayed, it would complete the task.
            "tasks/update (the task's own key)",
            "tasks/update",
            {"taskId": task_id, "inputResponses": {own_key: APPROVE}},
        ),
        ("tasks/cancel", "tasks/cancel", {"taskId": task_id}),
    ]


async def run_ownership_matrix(
    http: aiohttp.ClientSession, backends: list[BackendProcess], sharing: str
) -> Matrix:
    """Four principals in two tenants each create a task; everyone else attacks it."""
    matrix = Matrix()
    async with (
        running_issuer("ES256") as issuer,
        gateway_for(issuer, backends, task_sharing=sharing) as gateway,
    ):
        url = gateway.url
        callers = [
            Caller(tenant, subject, issuer.token(tenant, subject))
            for tenant in ("acme", "globex")
            for subject in ("alice", "bob")
        ]

        def may_use(caller: Caller, owner: Caller) -> bool:
            if caller.tenant != owner.tenant:
                return False
            return sharing == "tenant" or caller.subject == owner.subject

        owned: dict[Caller, Owned] = {}
        for owner in callers:
            task_id = await create_report(http, url, owner.token)
            (key,) = (await parked(http, url, owner.token, task_id))["inputRequests"]
            owned[owner] = Owned(task_id, key)

        # Whoever may use a task reads it (the owner always; tenant peers when shared).
        for caller in callers:
            for owner, task in owned.items():
                if may_use(caller, owner):
                    answer = await call(
                        http,
                        url,
                        "tasks/get",
                        {"taskId": task.task_id},
                        authorization=bearer(caller.token),
                    )
                    message = answer.message
                    if (
                        answer.status != 200
                        or message.get("result", {}).get("taskId") != task.task_id
                    ):
                        seen = f"{answer.status} {_short(answer.raw)}"
                        matrix.problems.append(f"{caller} cannot read {owner}'s task: {seen}")

        # Ids that must all be answered like one that never existed, by every caller: the
        # other principals' tasks, a route that expired, and ids no task can have.
        gone = await create_report(http, url, callers[0].token)
        await gateway.expire_route(gone)
        targets: list[tuple[Caller | None, str, str, str]] = [
            (owner, f"{owner}'s task", task.task_id, task.input_key)
            for owner, task in owned.items()
        ]
        targets += [
            (None, f"{callers[0]}'s expired route", gone, "k"),
            (None, "a malformed id (a space)", "no such id", "k"),
            (None, "a malformed id (300 characters)", "x" * 300, "k"),
        ]
        never_created = secrets.token_urlsafe(32)  # shaped like FastMCP's ids
        for caller in callers:
            for holder, what, task_id, input_key in targets:
                if holder is not None and may_use(caller, holder):
                    continue
                pairs = zip(
                    _attack_params(task_id, input_key),
                    _attack_params(never_created, input_key),
                    strict=True,
                )
                for (label, method, foreign), (_, _, unknown) in pairs:
                    for name_header in (True, False):
                        request_id = next(ids)
                        sent: dict[str, Any] = {
                            "authorization": bearer(caller.token),
                            "request_id": request_id,
                            "name_header": name_header,
                        }
                        variant = "Mcp-Name = taskId" if name_header else "no Mcp-Name"
                        matrix.attempts.append(
                            Attempt(
                                f"{caller} -> {what}, {label}, {variant}",
                                request_id,
                                await call(http, url, method, foreign, **sent),
                                await call(http, url, method, unknown, **sent),
                            )
                        )

        # No foreign cancel or update reached a backend: each task still waits, as it was.
        for owner, task in owned.items():
            state = await get_task(http, url, owner.token, task.task_id)
            if state["status"] != "input_required" or list(state.get("inputRequests", {})) != [
                task.input_key
            ]:
                matrix.problems.append(
                    f"{owner}'s task changed under the attacks: status {state['status']!r}, "
                    f"inputRequests {list(state.get('inputRequests', {}))!r}"
                )
    return matrix


def _short(raw: bytes) -> str:
    return repr(raw if len(raw) <= 160 else raw[:160] + b"...")


def _report(title: str, failures: list[str]) -> str:
    return f"{len(failures)} {title}:\n  " + "\n  ".join(failures)


# callers x (foreign tasks + 3 dead ids) x 4 method variants x 2 header variants; a task is
# foreign to 3 callers under principal sharing, to the 2 of the other tenant under tenant.
EXPECTED_ATTEMPTS = {"principal": 4 * (3 + 3) * 4 * 2, "tenant": 4 * (2 + 3) * 4 * 2}


@pytest.mark.parametrize("sharing", ["principal", "tenant"])
async def test_foreign_task_ids_answer_byte_for_byte_like_unknown_ones(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess], sharing: str
) -> None:
    matrix = await run_ownership_matrix(http, report_backends, sharing)
    assert len(matrix.attempts) == EXPECTED_ATTEMPTS[sharing]
    failures = list(matrix.problems)
    for attempt in matrix.attempts:
        unknown, foreign = attempt.unknown, attempt.foreign
        if unknown.status != 200 or unknown.message != not_found(attempt.request_id):
            failures.append(
                f"{attempt.label}: the unknown id was not answered 'Task not found': "
                f"{unknown.status} {_short(unknown.raw)}"
            )
        if (foreign.status, foreign.raw) != (unknown.status, unknown.raw):
            failures.append(
                f"{attempt.label}: {foreign.status} {_short(foreign.raw)} "
                f"!= unknown {unknown.status} {_short(unknown.raw)}"
            )
    assert not failures, _report("ownership failures", failures)


async def test_foreign_and_unknown_task_answers_carry_the_same_headers(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess]
) -> None:
    matrix = await run_ownership_matrix(http, report_backends, "principal")
    assert len(matrix.attempts) == EXPECTED_ATTEMPTS["principal"]
    failures = []
    for attempt in matrix.attempts:
        foreign, unknown = attempt.foreign, attempt.unknown
        names = {name for name, _ in headers_but_date(foreign)}
        if names != {name for name, _ in headers_but_date(unknown)}:
            failures.append(f"{attempt.label}: header names differ")
        if foreign.headers.get("Content-Length") != unknown.headers.get("Content-Length"):
            failures.append(
                f"{attempt.label}: Content-Length {foreign.headers.get('Content-Length')} "
                f"!= {unknown.headers.get('Content-Length')}"
            )
        if headers_but_date(foreign) != headers_but_date(unknown):
            failures.append(
                f"{attempt.label}: {headers_but_date(foreign)} != {headers_but_date(unknown)}"
            )
    assert not failures, _report("header differences", failures)


# ---------------------------------------------------------------------------------------------
# 2. Token defects


@dataclass
class Forge:
    """The trusted issuer (an ES256 and an RS256 key in its JWKS) and an attacker's issuer."""

    issuer: Issuer
    attacker: Issuer

    @property
    def es(self) -> SigningKey:
        return self.issuer.keys[0]

    @property
    def rs(self) -> SigningKey:
        return self.issuer.keys[1]

    def good(self, **claims: Any) -> str:
        """A valid acme/alice token (claims override; None removes one)."""
        tenant = claims.pop("tenant", "acme")
        return self.issuer.token(tenant, "alice", **claims)

    def payload(self, **claims: Any) -> dict[str, Any]:
        return claims_of(self.good(**claims))

    def by_hand(
        self, payload: list[tuple[str, Any]], header: list[tuple[str, Any]] | None = None
    ) -> str:
        """Signed by the trusted ES256 key over JSON written pair by pair (repeats kept)."""
        header = header or [("alg", "ES256"), ("kid", self.es.kid), ("typ", "JWT")]
        return signed_by_hand(self.es, json_pairs(header), json_pairs(payload))


def _swap_header(token: str, header: dict[str, Any]) -> str:
    _, payload, signature = token.split(".")
    return f"{segment(header)}.{payload}.{signature}"


def _basic(userinfo: str) -> str:
    return "Basic " + base64.b64encode(userinfo.encode()).decode()


Defect = Callable[[Forge], list[str]]

# A token was presented and is unusable: RFC 6750 3.1 and the core's basic/authorization say
# 401 invalid_token.
INVALID: dict[str, Defect] = {
    "expired beyond the leeway": lambda f: bearer(f.good(lifetime_s=-120)),
    "not yet valid (nbf in 10 min)": lambda f: bearer(f.good(nbf=int(time.time()) + 600)),
    "wrong audience": lambda f: bearer(f.good(aud="https://other.test/mcp")),
    "audience of another path on the same host": lambda f: bearer(
        f.good(aud=f"{_aud.scheme}://{_aud.netloc}/other")
    ),
    "audience list without ours": lambda f: bearer(f.good(aud=["https://other.test/mcp"])),
    "audience missing": lambda f: bearer(f.good(aud=None)),
    "wrong issuer": lambda f: bearer(f.good(iss="https://evil.test")),
    "issuer missing": lambda f: bearer(f.good(iss=None)),
    "exp missing": lambda f: bearer(f.good(exp=None)),
    "HS256 with a made-up secret and a real kid": lambda f: bearer(
        jwt.encode(f.payload(), "x" * 32, algorithm="HS256", headers={"kid": f.es.kid})
    ),
    "HS256 keyed with the ES256 public key's PEM": lambda f: bearer(
        hs256_by_hand({"typ": "JWT", "kid": f.es.kid}, f.payload(), public_pem(f.es))
    ),
    "HS256 keyed with the RS256 public key's PEM": lambda f: bearer(
        hs256_by_hand({"typ": "JWT", "kid": f.rs.kid}, f.payload(), public_pem(f.rs))
    ),
    "alg none": lambda f: bearer(unsigned({"typ": "JWT", "kid": f.es.kid}, f.payload())),
    "alg None": lambda f: bearer(unsigned({"kid": f.es.kid}, f.payload(), alg="None")),
    "alg NONE": lambda f: bearer(unsigned({"kid": f.es.kid}, f.payload(), alg="NONE")),
    "alg none with a real signature kept": lambda f: bearer(
        _swap_header(f.good(), {"alg": "none", "kid": f.es.kid})
    ),
    "signed by another key with the same kid": lambda f: bearer(
        f.issuer.token("acme", "alice", key=SigningKey("ES256", new_key("ES256"), kid=f.es.kid))
    ),
    "tampered tenant": lambda f: bearer(tampered(f.good(), tenant="globex")),
    "tampered subject": lambda f: bearer(tampered(f.good(), sub="bob")),
    "tampered exp (an expired token made young)": lambda f: bearer(
        tampered(f.good(lifetime_s=-120), exp=int(time.time()) + 300)
    ),
    "kid the JWKS does not have": lambda f: bearer(
        f.issuer.token("acme", "alice", key=SigningKey("ES256", new_key("ES256"), kid="absent"))
    ),
    "ES256 signature under the RS256 key's kid": lambda f: bearer(
        f.issuer.token("acme", "alice", key=f.es, headers={"kid": f.rs.kid})
    ),
    "header alg switched to RS256, ES256 signature kept": lambda f: bearer(
        _swap_header(f.good(), {**header_of(f.good()), "alg": "RS256", "kid": f.rs.kid})
    ),
    "attacker's key announced with jku": lambda f: bearer(
        f.attacker.token("acme", "alice", headers={"jku": f.attacker.jwks_url})
    ),
    "attacker's key embedded as jwk": lambda f: bearer(
        f.attacker.token("acme", "alice", headers={"jwk": f.attacker.keys[0].jwk()})
    ),
    "attacker's token with a trusted kid": lambda f: bearer(
        f.attacker.token("acme", "alice", headers={"kid": f.es.kid})
    ),
    "garbage": lambda f: ["Bearer abc"],
    "three garbage segments": lambda f: ["Bearer a.b.c"],
    "two Authorization headers (two principals)": lambda f: [
        *bearer(f.good()),
        *bearer(f.issuer.token("globex", "bob")),
    ],
    "two Authorization headers (the same token twice)": lambda f: bearer(f.good()) * 2,
    "tenant claim missing": lambda f: bearer(f.good(tenant=None)),
    "sub missing": lambda f: bearer(f.good(sub=None)),
    "tenant not a string (number)": lambda f: bearer(f.good(tenant=123)),
    "tenant not a string (list)": lambda f: bearer(f.good(tenant=["acme"])),
    "tenant empty": lambda f: bearer(f.good(tenant="")),
    "sub not a string": lambda f: bearer(f.good(sub=42)),
    # A backend reading identity headers would see "acme" (the header writer strips the space),
    # or refuse the request (a control character).
    "tenant with a leading space": lambda f: bearer(f.good(tenant=" acme")),
    "sub with a trailing space": lambda f: bearer(f.good(sub="alice ")),
    "sub with a vertical tab": lambda f: bearer(f.good(sub="al\x0bice")),
    "tenant with DEL": lambda f: bearer(f.good(tenant="acme\x7f")),
    # Parsers disagree on which copy of a repeated key counts.
    "payload names the tenant twice (globex, then acme)": lambda f: bearer(
        f.by_hand([("tenant", "globex"), *f.payload(tenant=None).items(), ("tenant", "acme")])
    ),
    "header names alg twice (none, then ES256)": lambda f: bearer(
        f.by_hand(list(f.payload().items()), [("alg", "none"), ("kid", f.es.kid), ("alg", "ES256")])
    ),
    # Time claims must be NumericDates: pyjwt's int() would take these.
    "exp a string": lambda f: bearer(f.good(exp="9999999999")),
    "exp 1e30": lambda f: bearer(f.good(exp=1e30)),
    "nbf a string": lambda f: bearer(f.good(nbf="0")),
    "nbf true": lambda f: bearer(f.good(nbf=True)),
    "iat a string": lambda f: bearer(f.good(iat="0")),
}

# No bearer token at all: RFC 6750 3.1 says the challenge SHOULD NOT carry an error code when
# the request "lacks any authentication information (... an unsupported authentication scheme)".
NO_CREDENTIALS: dict[str, Defect] = {
    "no Authorization header": lambda f: [],
    "empty bearer": lambda f: ["Bearer "],
    "Basic scheme": lambda f: [_basic("alice:secret")],
    "a valid token under the Basic scheme": lambda f: [f"Basic {f.good()}"],
}

# Tokens a little out of time, inside the 30 s leeway, and spellings RFC 7235 allows.
ACCEPTED: dict[str, Defect] = {
    "expired 10 s ago (leeway 30 s)": lambda f: bearer(f.good(lifetime_s=-10)),
    "nbf 10 s ahead (leeway 30 s)": lambda f: bearer(f.good(nbf=int(time.time()) + 10)),
    "lower-case scheme": lambda f: [f"bearer {f.good()}"],
    "audience list containing ours": lambda f: bearer(f.good(aud=["https://x.test", AUDIENCE])),
}

TARGETS = ["tasks/get of the caller's own task", "tools/call", "tools/list"]


@dataclass
class Scene:
    forge: Forge
    gateway: RunningGateway
    own_task: str

    def request(self, target: str) -> tuple[str, JsonObject]:
        if target == TARGETS[0]:
            return "tasks/get", {"taskId": self.own_task}
        if target == "tools/call":
            return "tools/call", {"name": "generate_report", "arguments": {"size": "small"}}
        return "tools/list", {}


@pytest.fixture
async def scene(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess]
) -> AsyncIterator[Scene]:
    async with running_issuer("ES256") as issuer, running_issuer("ES256") as attacker:
        issuer.keys.append(SigningKey("RS256", rsa_key()))
        forge = Forge(issuer, attacker)
        async with gateway_for(issuer, report_backends) as gateway:
            own_task = await create_report(http, gateway.url, forge.good())
            yield Scene(forge, gateway, own_task)
        assert attacker.fetches == 0, "taskgate fetched keys from a URL a token named"


async def _refused(
    http: aiohttp.ClientSession, scene: Scene, target: str, defect: Defect, *, error: bool
) -> None:
    url, routes = scene.gateway.url, scene.gateway.state.tasks.cache
    method, params = scene.request(target)
    request_id = next(ids)
    recorded_before = len(routes)
    answer = await call(
        http, url, method, params, authorization=defect(scene.forge), request_id=request_id
    )
    assert answer.status == 401, (answer.status, answer.raw)
    challenges = answer.headers.getall("WWW-Authenticate", [])
    assert len(challenges) == 1, challenges
    (www,) = challenges
    assert www.startswith("Bearer "), www
    assert f'resource_metadata="{METADATA_URL}"' in www, www
    if error:
        assert 'error="invalid_token"' in www, www
    else:
        assert "error=" not in www, www
    # Nothing about the task, the tools or the reason: the body of a request with no token.
    bare = await call(http, url, method, params, authorization=[], request_id=request_id)
    assert (bare.status, answer.raw) == (401, bare.raw)
    assert scene.own_task.encode() not in answer.raw
    assert b"generate_report" not in answer.raw
    assert "result" not in answer.message
    assert len(routes) == recorded_before, "a refused tools/call created a task"
    # The same request with a good token goes through: the refusal was the token's doing.
    result(await call(http, url, method, params, authorization=bearer(scene.forge.good())))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("defect", INVALID.values(), ids=INVALID.keys())
async def test_an_unusable_token_is_refused_as_invalid(
    http: aiohttp.ClientSession, scene: Scene, target: str, defect: Defect
) -> None:
    await _refused(http, scene, target, defect, error=True)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("defect", NO_CREDENTIALS.values(), ids=NO_CREDENTIALS.keys())
async def test_a_request_without_a_bearer_token_gets_a_plain_challenge(
    http: aiohttp.ClientSession, scene: Scene, target: str, defect: Defect
) -> None:
    await _refused(http, scene, target, defect, error=False)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("accepted", ACCEPTED.values(), ids=ACCEPTED.keys())
async def test_a_token_inside_the_rules_is_accepted(
    http: aiohttp.ClientSession, scene: Scene, target: str, accepted: Defect
) -> None:
    method, params = scene.request(target)
    found = result(
        await call(http, scene.gateway.url, method, params, authorization=accepted(scene.forge))
    )
    if method == "tasks/get":
        assert found["taskId"] == scene.own_task
    elif method == "tools/call":
        assert found["resultType"] == "task"
    else:
        assert "generate_report" in {tool["name"] for tool in found["tools"]}


async def test_an_oversized_token_never_gets_through(
    http: aiohttp.ClientSession, scene: Scene
) -> None:
    # The listener refuses a header line over 8190 bytes before the pipeline sees it (431);
    # the call must not run.
    oversized = scene.forge.good(padding="x" * 9000)
    method, params = scene.request("tools/call")
    recorded_before = len(scene.gateway.state.tasks.cache)
    answer = await call(http, scene.gateway.url, method, params, authorization=bearer(oversized))
    assert answer.status == 431, (answer.status, answer.raw)
    assert len(scene.gateway.state.tasks.cache) == recorded_before


async def test_a_token_in_the_query_string_is_not_a_credential(
    http: aiohttp.ClientSession, scene: Scene
) -> None:
    # The core's basic/authorization: the token travels in the Authorization header, never in
    # the query string.
    method, params = scene.request("tools/list")
    body = build_request(method, params, id=next(ids))
    url = f"{scene.gateway.url}?access_token={scene.forge.good()}"
    answer = await send(http, url, body)
    assert answer.status == 401, (answer.status, answer.raw)
    assert answer.headers["WWW-Authenticate"] == f'Bearer resource_metadata="{METADATA_URL}"'
    assert b"generate_report" not in answer.raw


# ---------------------------------------------------------------------------------------------
# 3. Algorithms


@pytest.mark.parametrize("alg", ["ES256", "RS256", "EdDSA"])
async def test_every_allowed_algorithm_gets_a_caller_through(
    http: aiohttp.ClientSession, report_backends: list[BackendProcess], alg: str
) -> None:
    async with running_issuer("ES256", "EdDSA") as issuer:
        issuer.keys.append(SigningKey("RS256", rsa_key()))
        (key,) = [k for k in issuer.keys if k.alg == alg]
        token = issuer.token("acme", alg.lower(), key=key)
        assert jwt.get_unverified_header(token)["alg"] == alg
        async with gateway_for(issuer, report_backends) as gateway:
            params = {"name": "echo", "arguments": {"text": f"signed with {alg}"}}
            echoed = result(
                await call(http, gateway.url, "tools/call", params, authorization=bearer(token))
            )
            assert echoed["content"][0]["text"] == f"signed with {alg}", echoed
            task_id = await create_report(http, gateway.url, token)
            assert (await get_task(http, gateway.url, token, task_id))["status"] in (
                "working",
                "input_required",
            )
