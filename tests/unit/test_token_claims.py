"""What a signed token may say: JSON that repeats no key, time claims that are NumericDates,
and a tenant and principal that a backend reads exactly as taskgate checked them."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import pytest

from gateway.auth.authenticator import JWTAuthenticator, Remembered
from gateway.auth.jwks import StaticKeys
from gateway.auth.keys import VerificationKey
from gateway.auth.verify import Rules, TokenError, Verified, read_header, verify
from gateway.errors import Unauthorized
from tests.support.attacks import claims_of, json_pairs, signed_by_hand
from tests.support.issuer import AUDIENCE, ISSUER, Issuer, SigningKey, new_key

RULES = Rules(
    issuer=ISSUER,
    audience=AUDIENCE,
    algorithms=frozenset({"ES256"}),
    tenant_claim="tenant",
    principal_claim="sub",
    leeway_s=30,
)
SIGNING = SigningKey("ES256", new_key("ES256"))
KEY = VerificationKey(SIGNING.kid, "ES256", SIGNING.private.public_key())
ISSUER_OF_TESTS = Issuer(keys=[SIGNING])  # signs only; no JWKS is served


def checked(token: str, rules: Rules = RULES) -> Verified:
    """What JWTAuthenticator does on a cache miss: the header, then the signature and claims."""
    read_header(token, rules)
    return verify(token, KEY, rules)


def refusal(token: str, rules: Rules = RULES) -> str:
    with pytest.raises(TokenError) as refused:
        checked(token, rules)
    return str(refused.value)


def good_pairs(**changes: Any) -> list[tuple[str, Any]]:
    """The claims of a valid acme/alice token, in order (keyword claims replace theirs)."""
    claims = {**claims_of(ISSUER_OF_TESTS.token("acme", "alice")), **changes}
    return list(claims.items())


HEADER = json_pairs([("alg", "ES256"), ("kid", SIGNING.kid), ("typ", "JWT")])


def by_hand(payload: bytes, header: bytes = HEADER) -> str:
    return signed_by_hand(SIGNING, header, payload)


# ---------------------------------------------------------------------------------------------
# Tenant and principal: values a header writer would strip or refuse


WHITESPACE = "has leading or trailing whitespace"
CONTROL = "holds a control character"
MISSING = "is missing, empty or not a string"
UNSENDABLE = {
    "leading space": (" acme", WHITESPACE),
    "trailing space": ("acme ", WHITESPACE),
    "leading tab": ("\tacme", WHITESPACE),
    "trailing line feed": ("acme\n", WHITESPACE),
    "leading no-break space": ("\u00a0acme", WHITESPACE),
    "trailing ideographic space": ("acme\u3000", WHITESPACE),
    "vertical tab inside": ("ac\x0bme", CONTROL),
    "tab inside": ("ac\tme", CONTROL),
    "DEL inside": ("ac\x7fme", CONTROL),
    "DEL at the end": ("acme\x7f", CONTROL),
    "ESC inside": ("ac\x1bme", CONTROL),
    "NUL inside": ("ac\x00me", CONTROL),
    "CR LF inside (a header injection)": ("acme\r\nX-Tenant: globex", CONTROL),
    "C1 NEL inside": ("ac\x85me", CONTROL),
    "C1 CSI inside": ("ac\x9bme", CONTROL),
}


@pytest.mark.parametrize("claim", ["tenant", "sub"])
@pytest.mark.parametrize(
    ("value", "problem"), list(UNSENDABLE.values()), ids=list(UNSENDABLE.keys())
)
def test_an_identity_claim_a_backend_would_read_otherwise_is_refused_naming_it(
    claim: str, value: str, problem: str
) -> None:
    identity: dict[str, Any] = {"tenant": "acme", "subject": "alice"} | {claim: value}
    token = ISSUER_OF_TESTS.token(**identity)
    assert claims_of(token)[claim] == value  # signed as it is
    assert refusal(token) == f"the token's {claim!r} claim {problem}"


@pytest.mark.parametrize("value", ["acme", "ac me", "äcme", "租户", "acme-eu_1.prod", "a"])
def test_an_identity_claim_that_survives_a_header_is_the_principal_as_signed(value: str) -> None:
    principal = checked(ISSUER_OF_TESTS.token(value, value)).principal
    assert (principal.tenant, principal.subject) == (value, value)


@pytest.mark.parametrize(
    ("value", "problem"),
    [(None, MISSING), ("", MISSING), (" org", WHITESPACE), ("o\x0brg", CONTROL)],
)
def test_configured_claim_names_are_the_ones_checked_and_named(
    value: str | None, problem: str
) -> None:
    rules = dataclasses.replace(RULES, tenant_claim="org", principal_claim="email")
    token = ISSUER_OF_TESTS.token(org=value, email="alice@acme.test")
    assert refusal(token, rules) == f"the token's 'org' claim {problem}"
    # The default claims' names are no longer read, whatever they hold.
    fine = ISSUER_OF_TESTS.token(" acme", " alice", org="acme", email="alice@acme.test")
    assert checked(fine, rules).principal.tenant == "acme"


# ---------------------------------------------------------------------------------------------
# Repeated keys


REPEATS: dict[str, tuple[bytes, bytes, str]] = {
    # (header, payload, what the refusal names)
    "payload: tenant globex, then acme": (
        HEADER,
        json_pairs([("tenant", "globex"), *good_pairs(), ("tenant", "acme")]),
        "the payload repeats the key 'tenant'",
    ),
    "payload: tenant acme, then globex": (
        HEADER,
        json_pairs([*good_pairs(), ("tenant", "globex")]),
        "the payload repeats the key 'tenant'",
    ),
    "payload: the same tenant twice": (
        HEADER,
        json_pairs([*good_pairs(), ("tenant", "acme")]),
        "the payload repeats the key 'tenant'",
    ),
    "payload: sub twice": (
        HEADER,
        json_pairs([*good_pairs(), ("sub", "bob")]),
        "the payload repeats the key 'sub'",
    ),
    "payload: an expired exp, then a fresh one": (
        HEADER,
        json_pairs([("exp", 1), *good_pairs()]),
        "the payload repeats the key 'exp'",
    ),
    "payload: tenant, then the same key spelt with an escape": (
        HEADER,
        json_pairs([*good_pairs(), ("\0", "globex")]).replace(b'"\\u0000"', b'"\\u0074enant"'),
        "the payload repeats the key 'tenant'",
    ),
    "payload: a key repeated inside a claim's object": (
        HEADER,
        json_pairs([*good_pairs(), ("org", {"id": 1})]).replace(b'{"id":1}', b'{"id":1,"id":2}'),
        "the payload repeats the key 'id'",
    ),
    "header: alg none, then ES256": (
        json_pairs([("alg", "none"), ("kid", SIGNING.kid), ("alg", "ES256")]),
        json_pairs(good_pairs()),
        "the header repeats the key 'alg'",
    ),
    "header: kid twice": (
        json_pairs([("alg", "ES256"), ("kid", "other"), ("kid", SIGNING.kid)]),
        json_pairs(good_pairs()),
        "the header repeats the key 'kid'",
    ),
}


@pytest.mark.parametrize(
    ("header", "payload", "named"), list(REPEATS.values()), ids=list(REPEATS.keys())
)
def test_a_token_whose_json_repeats_a_key_is_refused(
    header: bytes, payload: bytes, named: str
) -> None:
    assert refusal(by_hand(payload, header)) == f"malformed token: {named}"


def test_keys_and_values_with_colons_are_no_repeat() -> None:
    # Namespaced claims (a URL as the key) and URLs as values: the fast count of colons
    # cannot decide these, the exact parse does.
    claims = good_pairs(**{"https://acme.test/claims": {"role": "a:b", "urn:x": 1}})
    principal = checked(by_hand(json_pairs(claims))).principal
    assert (principal.tenant, principal.subject) == ("acme", "alice")


# ---------------------------------------------------------------------------------------------
# Time claims: NumericDates only


YEAR_10000 = 253_402_300_800  # 10000-01-01T00:00:00Z, where NumericDates taskgate takes end
NOT_A_NUMBER = "is not a JSON number"
OUT_OF_RANGE = f"is out of range (a NumericDate is 0 to {YEAR_10000}, before the year 10000)"
IN_AN_HOUR = int(time.time()) + 3600
BAD_TIMES: dict[str, tuple[str, Any, str]] = {
    "exp a string": ("exp", "9999999999", NOT_A_NUMBER),
    "exp 1e30": ("exp", 1e30, OUT_OF_RANGE),
    "exp at the year 10000": ("exp", YEAR_10000, OUT_OF_RANGE),
    "exp true": ("exp", True, NOT_A_NUMBER),
    "exp null": ("exp", None, NOT_A_NUMBER),
    "exp a list": ("exp", [IN_AN_HOUR], NOT_A_NUMBER),
    "nbf a string": ("nbf", "0", NOT_A_NUMBER),
    "nbf true": ("nbf", True, NOT_A_NUMBER),
    "nbf negative": ("nbf", -1, OUT_OF_RANGE),
    "iat a string": ("iat", "0", NOT_A_NUMBER),
    "iat false": ("iat", False, NOT_A_NUMBER),
    "iat an object": ("iat", {"$date": 0}, NOT_A_NUMBER),
}


@pytest.mark.parametrize(
    ("claim", "value", "problem"), list(BAD_TIMES.values()), ids=list(BAD_TIMES.keys())
)
def test_a_time_claim_that_is_no_numeric_date_is_refused_naming_it(
    claim: str, value: Any, problem: str
) -> None:
    # Written by hand: None must stay a JSON null, and every claim must be signed as it is.
    token = by_hand(json_pairs(good_pairs(**{claim: value})))
    assert claims_of(token)[claim] == value
    assert refusal(token) == f"the token's {claim!r} claim {problem}"


@pytest.mark.parametrize(
    "changes",
    [
        {"exp": IN_AN_HOUR + 0.5},
        {"nbf": 0, "iat": 0},
        {"nbf": 0.0},
        {"exp": YEAR_10000 - 1},
    ],
    ids=["a fractional exp", "nbf and iat at the epoch", "a float nbf", "exp in 9999"],
)
def test_numeric_dates_in_range_are_accepted(changes: dict[str, Any]) -> None:
    claims = good_pairs(**changes)
    verified = checked(by_hand(json_pairs(claims)))
    assert verified.principal.tenant == "acme"
    assert verified.expires_at == float(dict(claims)["exp"])


# ---------------------------------------------------------------------------------------------
# Through the authenticator: 401 invalid_token, the reason in the log, nothing cached


async def test_the_authenticator_answers_401_and_logs_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    authenticator = JWTAuthenticator(
        RULES, StaticKeys((KEY,)), "https://gateway.test/meta", cache_size=10
    )
    token = by_hand(json_pairs([("tenant", "globex"), *good_pairs(), ("tenant", "acme")]))
    for _ in range(2):  # the second time too: a refusal is not remembered as a principal
        with (
            caplog.at_level(logging.INFO, logger="taskgate.auth"),
            pytest.raises(Unauthorized) as refused,
        ):
            await authenticator.authenticate([f"Bearer {token}"])
        assert refused.value.status == 401
        assert refused.value.headers["WWW-Authenticate"] == (
            'Bearer error="invalid_token", resource_metadata="https://gateway.test/meta"'
        )
    logged = [r.getMessage() for r in caplog.records if r.name == "taskgate.auth"]
    assert (
        logged
        == ["refused a bearer token: malformed token: the payload repeats the key 'tenant'"] * 2
    )
    assert (authenticator.cache_hits, authenticator.cache_misses) == (0, 2)


async def test_a_token_verified_once_is_known_without_verifying_it_again() -> None:
    authenticator = JWTAuthenticator(
        RULES, StaticKeys((KEY,)), "https://gateway.test/meta", cache_size=10
    )
    token = by_hand(json_pairs(good_pairs()))
    header = [f"Bearer {token}"]
    assert authenticator.known(header) is None  # never verified: authenticate must
    principal = await authenticator.authenticate(header)
    assert authenticator.known(header) == principal
    assert authenticator.known([f"bearer   {token} "]) == principal  # the same token
    # Not known, each for authenticate to refuse or verify: two credentials, another scheme,
    # another token.
    assert authenticator.known([*header, *header]) is None
    assert authenticator.known([f"Basic {token}"]) is None
    assert authenticator.known([f"Bearer {token}x"]) is None
    assert (authenticator.cache_hits, authenticator.cache_misses) == (2, 1)
    bad = by_hand(json_pairs([("tenant", "globex"), *good_pairs(), ("tenant", "acme")]))
    with pytest.raises(Unauthorized):
        await authenticator.authenticate([f"Bearer {bad}"])
    assert authenticator.known([f"Bearer {bad}"]) is None  # a refusal is not remembered


async def test_a_connections_memo_recalls_only_the_same_token_while_it_holds() -> None:
    authenticator = JWTAuthenticator(
        RULES, StaticKeys((KEY,)), "https://gateway.test/meta", cache_size=10
    )
    token = by_hand(json_pairs(good_pairs()))
    raw = f"Bearer {token}".encode()
    assert authenticator.memo(raw) is None  # not verified yet: nothing to remember
    principal = await authenticator.authenticate([raw.decode()])
    memo = authenticator.memo(raw)
    assert authenticator.recall(raw, memo) == principal
    # Other bytes are not recalled, even for the same token: known() decides those.
    assert authenticator.recall(f"bearer  {token}".encode(), memo) is None
    assert authenticator.recall(raw + b"x", memo) is None
    assert authenticator.recall(raw, None) is None
    # Another authenticator (a reload: new keys, new rules) does not take this one's memo.
    reloaded = JWTAuthenticator(
        RULES, StaticKeys((KEY,)), "https://gateway.test/meta", cache_size=10
    )
    assert reloaded.recall(raw, memo) is None
    # With the cache off there is nothing to remember: every request is verified.
    uncached = JWTAuthenticator(
        RULES, StaticKeys((KEY,)), "https://gateway.test/meta", cache_size=0
    )
    await uncached.authenticate([raw.decode()])
    assert uncached.memo(raw) is None


async def test_a_memo_past_its_tokens_exp_recalls_nothing() -> None:
    authenticator = JWTAuthenticator(
        RULES, StaticKeys((KEY,)), "https://gateway.test/meta", cache_size=10
    )
    # exp 1 s ahead, within the leeway; the memo must hold it no later than exp.
    now = int(time.time())
    token = by_hand(json_pairs(good_pairs(iat=now - 10, exp=now + 1)))
    raw = f"Bearer {token}".encode()
    await authenticator.authenticate([raw.decode()])
    memo = authenticator.memo(raw)
    assert authenticator.recall(raw, memo) is not None
    assert isinstance(memo, Remembered)
    expired = Remembered(raw, dataclasses.replace(memo.verified, expires_at=time.time()), memo.by)
    assert authenticator.recall(raw, expired) is None
