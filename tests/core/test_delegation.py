"""Delegation chains (spec "Delegation verification", "Delegation token claims", "Limits").

Every negative test builds a chain with the low-level signer so that exactly one rule is broken,
then asserts the precise sub-reason; the denial reason is always DENIAL_REASON_DELEGATION_INVALID.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from signing_proxy.core import delegation
from signing_proxy.core.b64 import b64url_encode
from signing_proxy.core.delegation import (
    REASONS,
    THUMBPRINT_URI_PREFIX,
    Caps,
    VerifiedDelegation,
    check_chain,
    extend_chain,
    inspect_chain,
    issue_authority,
    split_chain,
    verify_chain,
)
from signing_proxy.core.errors import DelegationError
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.jws import sign_jws, sign_jwt

NOW = 1_700_000_000
HOUR = 3_600
DAY = 86_400

OWNER = SigningKey.from_seed(b"\x01" * 32)
OWNER_PREVIOUS = SigningKey.from_seed(b"\x02" * 32)  # rotated out of signing, still in the directory
PRINCIPAL = SigningKey.from_seed(b"\x03" * 32)
AGENT = SigningKey.from_seed(b"\x04" * 32)
SUBAGENT = SigningKey.from_seed(b"\x05" * 32)
MALLORY = SigningKey.from_seed(b"\x06" * 32)

DROP = object()  # marks a claim to leave out

# A well-formed chain narrows at every level; tests override one claim of one level.
LEVELS: list[dict[str, Any]] = [
    {
        "iss": "https://owner.example",
        "exp": NOW + DAY,
        "scope": "dist:*",
        "svc_max_spend_cents": "10000",
        "svc_max_accesses": 100,
        "svc_quota_period": "86400s",
    },
    {
        "iss": "https://principal.example",
        "exp": NOW + HOUR,
        "scope": "dist:US",
        "svc_max_spend_cents": "5000",
        "svc_max_accesses": 50,
        "svc_quota_period": "86400s",
    },
    {
        "iss": "https://agent.example",
        "exp": NOW + HOUR // 2,
        "scope": "dist:US",
        "svc_max_spend_cents": "1000",
        "svc_max_accesses": 10,
        "svc_quota_period": "86400s",
    },
]


def _claims(level: int, holder: SigningKey, over: dict[str, Any]) -> dict[str, Any]:
    claims = {**LEVELS[level], "cnf": {"jkt": holder.thumbprint}, **over}
    return {name: value for name, value in claims.items() if value is not DROP}


def authority(holder: SigningKey, *, signer: SigningKey = OWNER, **over: Any) -> str:
    """The level-0 JWT, signed by an owner key, bound to ``holder``."""
    return sign_jwt(_claims(0, holder, over), signer)


def link(
    level: int, signer: SigningKey, holder: SigningKey, *, jwk_of: SigningKey | None = None, **over: Any
) -> str:
    """A child JWT signed by ``signer`` whose jwk header names ``jwk_of`` (default: the signer)."""
    return sign_jwt(_claims(level, holder, over), signer, {"jwk": (jwk_of or signer).public.jwk()})


def chain(*tokens: str) -> str:
    return "~".join(tokens)


def two_links(**child_over: Any) -> str:
    """Owner -> principal -> agent, with overrides on the child."""
    return chain(authority(PRINCIPAL), link(1, PRINCIPAL, AGENT, **child_over))


def verify(token: str, *, holder: SigningKey = AGENT, **kwargs: Any) -> VerifiedDelegation:
    kwargs.setdefault("owner_keys", [OWNER.public])
    return verify_chain(token, holder_jkt=holder.thumbprint, now=NOW, **kwargs)


def refused(token: str, reason: str, *, holder: SigningKey = AGENT, **kwargs: Any) -> DelegationError:
    assert reason in REASONS
    with pytest.raises(DelegationError) as info:
        verify(token, holder=holder, **kwargs)
    assert info.value.reason == reason, info.value.detail
    assert info.value.denial_reason == "DENIAL_REASON_DELEGATION_INVALID"
    return info.value


def test_public_api_is_pinned() -> None:
    assert set(delegation.__all__) == {
        "ADVISORY_CLAIM",
        "CHAIN_SEPARATOR",
        "DURATION_MAX_S",
        "INT32_MAX",
        "INT64_MAX",
        "MAX_CHAIN_LINKS",
        "MAX_LEEWAY_S",
        "NUMERIC_DATE_MAX",
        "NUMERIC_DATE_MIN",
        "REASONS",
        "REGISTERED_CLAIMS",
        "SVC_CLAIMS",
        "SVC_PREFIX",
        "THUMBPRINT_URI_PREFIX",
        "Caps",
        "VerifiedDelegation",
        "VerifiedLink",
        "check_chain",
        "extend_chain",
        "inspect_chain",
        "issue_authority",
        "split_chain",
        "verify_chain",
    }


def test_reason_codes_are_pinned() -> None:
    assert set(REASONS) == {
        "malformed-chain",
        "malformed-token",
        "unsupported-algorithm",
        "unsupported-critical-header",
        "untrusted-issuer-key",
        "chain-linkage-broken",
        "signer-not-named-by-parent",
        "missing-claim",
        "bad-claim-type",
        "bad-claim-value",
        "reserved-claim",
        "unrecognized-claim",
        "audience-mismatch",
        "expired",
        "not-yet-valid",
        "scope-widened",
        "cap-raised",
        "outlives-parent",
        "holder-mismatch",
    }


# --- Happy paths: one, two and three links --------------------------------------------------------


def test_spec_delegation_verification_one_link() -> None:
    result = verify(authority(AGENT))
    assert result.scope == ("dist:*",)
    assert result.caps == Caps(max_spend_cents=10000, max_accesses=100, quota_period_s=DAY)
    assert result.holder_jkt == AGENT.thumbprint
    assert result.expires_at == NOW + DAY
    assert result.owner_jkt == OWNER.thumbprint
    assert result.issuer == "https://owner.example"
    assert [ln.signer_jkt for ln in result.links] == [OWNER.thumbprint]


def test_spec_delegation_verification_two_links() -> None:
    result = verify(two_links())
    assert result.scope == ("dist:US",)
    assert result.caps == Caps(max_spend_cents=5000, max_accesses=50, quota_period_s=DAY)
    assert result.expires_at == NOW + HOUR
    assert [ln.signer_jkt for ln in result.links] == [OWNER.thumbprint, PRINCIPAL.thumbprint]
    assert [ln.cnf_jkt for ln in result.links] == [PRINCIPAL.thumbprint, AGENT.thumbprint]


def test_spec_delegation_verification_three_links() -> None:
    token = chain(authority(PRINCIPAL), link(1, PRINCIPAL, AGENT), link(2, AGENT, SUBAGENT))
    result = verify(token, holder=SUBAGENT)
    assert len(result.links) == 3
    assert result.scope == ("dist:US",)
    assert result.caps == Caps(max_spend_cents=1000, max_accesses=10, quota_period_s=DAY)
    assert result.expires_at == NOW + HOUR // 2
    assert result.links[2].iss == "https://agent.example"
    assert result.links[2].signer_jkt == AGENT.thumbprint


def test_spec_delegation_absent_constraints_mean_no_constraint() -> None:
    # Rule 1: everything but cnf is optional; a bare grant verifies with no scope, cap or expiry.
    bare = authority(
        AGENT,
        exp=DROP,
        scope=DROP,
        svc_max_spend_cents=DROP,
        svc_max_accesses=DROP,
        svc_quota_period=DROP,
    )
    result = verify(bare)
    assert (result.scope, result.caps, result.expires_at) == (None, Caps(), None)


def test_spec_delegation_child_may_add_a_cap_and_scope_the_parent_lacks() -> None:
    parent = authority(PRINCIPAL, scope=DROP, svc_max_accesses=DROP, svc_quota_period=DROP)
    result = verify(chain(parent, link(1, PRINCIPAL, AGENT, svc_quota_period=DROP)))
    assert result.scope == ("dist:US",)
    assert result.caps == Caps(max_spend_cents=5000, max_accesses=50, quota_period_s=None)


def test_spec_delegation_child_may_equal_its_parent() -> None:
    same = {k: v for k, v in LEVELS[0].items() if k != "iss"}
    verify(two_links(**same))


# --- Step 1: the authority JWT and the owner's keys -------------------------------------------------


def test_spec_step1_untrusted_owner_key_is_refused() -> None:
    refused(chain(authority(PRINCIPAL, signer=MALLORY), link(1, PRINCIPAL, AGENT)), "untrusted-issuer-key")


def test_spec_step1_no_owner_keys_trusts_nothing() -> None:
    refused(authority(AGENT), "untrusted-issuer-key", owner_keys=[])


def test_spec_step1_authority_jwk_header_is_never_a_trust_anchor() -> None:
    token = sign_jwt(_claims(0, AGENT, {}), MALLORY, {"jwk": MALLORY.public.jwk()})
    refused(token, "untrusted-issuer-key")


def test_spec_rotation_previous_owner_key_accepted_when_passed() -> None:
    token = chain(authority(PRINCIPAL, signer=OWNER_PREVIOUS), link(1, PRINCIPAL, AGENT))
    refused(token, "untrusted-issuer-key")  # only the new key: refused
    result = verify(token, owner_keys=[OWNER.public, OWNER_PREVIOUS.public])
    assert result.owner_jkt == OWNER_PREVIOUS.thumbprint


# --- Step 2: linkage, signer, narrowing --------------------------------------------------------------


def test_spec_step2_broken_linkage_jwk_thumbprint_is_not_parent_cnf_jkt() -> None:
    # Validly self-signed by Mallory, whose key the parent never named.
    error = refused(two_links().split("~")[0] + "~" + link(1, MALLORY, AGENT), "chain-linkage-broken")
    assert error.detail.startswith("link 1:")


def test_spec_step2_child_without_jwk_header_is_broken_linkage() -> None:
    child = sign_jwt(_claims(1, AGENT, {}), PRINCIPAL)
    refused(chain(authority(PRINCIPAL), child), "chain-linkage-broken")


def test_spec_step2_signed_by_a_key_the_parent_did_not_name() -> None:
    # The jwk header names the principal (linkage holds) but Mallory signed.
    refused(
        chain(authority(PRINCIPAL), link(1, MALLORY, AGENT, jwk_of=PRINCIPAL)), "signer-not-named-by-parent"
    )


def test_spec_step2_tampered_child_claims_fail_its_signature() -> None:
    header, _payload, signature = link(1, PRINCIPAL, AGENT).split(".")
    forged_claims = b64url_encode(str(_claims(1, AGENT, {"scope": "*"})).encode())
    refused(chain(authority(PRINCIPAL), f"{header}.{forged_claims}.{signature}"), "malformed-token")
    forged = sign_jwt(_claims(1, AGENT, {"scope": "*"}), MALLORY).split(".")[1]
    refused(chain(authority(PRINCIPAL), f"{header}.{forged}.{signature}"), "signer-not-named-by-parent")


def test_spec_step2_header_jwk_with_private_member_is_refused_without_echoing_it() -> None:
    jwk = PRINCIPAL.to_jwk()  # kty, crv, x, d
    child = sign_jwt(_claims(1, AGENT, {}), PRINCIPAL, {"jwk": jwk})
    error = refused(chain(authority(PRINCIPAL), child), "malformed-token")
    assert jwk["d"] not in str(error)


@pytest.mark.parametrize(
    "jwk",
    [
        {"kty": "OKP", "crv": "Ed25519", "x": "AAAA"},
        {"kty": "EC", "crv": "P-256", "x": PRINCIPAL.public.jwk()["x"]},
        {"kty": "OKP", "crv": "Ed25519", "x": PRINCIPAL.public.jwk()["x"], "alg": "EdDSA"},
        "not-an-object",
    ],
)
def test_spec_rule5_child_jwk_is_exactly_an_okp_ed25519_public_key(jwk: Any) -> None:
    child = sign_jwt(_claims(1, AGENT, {}), PRINCIPAL, {"jwk": jwk})
    refused(chain(authority(PRINCIPAL), child), "malformed-token")


def test_spec_step2_widened_scope_is_refused() -> None:
    error = refused(two_links(scope="dist:US news"), "scope-widened")
    assert "news" in error.detail


def test_spec_step2_wildcard_child_under_narrower_parent_is_widened() -> None:
    refused(two_links(scope="*"), "scope-widened")


def test_spec_step2_child_dropping_scope_is_widened() -> None:
    refused(two_links(scope=DROP), "scope-widened")


def test_spec_scopes_choice_terminal_wildcard_does_not_cover_its_base() -> None:
    refused(two_links(scope="dist"), "scope-widened")


def test_spec_limits_raised_spend_cap_is_refused() -> None:
    refused(two_links(svc_max_spend_cents="10001"), "cap-raised")


@pytest.mark.parametrize(
    "over",
    [
        {"svc_max_accesses": 101},
        {"svc_max_spend_cents": DROP},  # absent means no cap: above any parent cap
        {"svc_max_accesses": DROP},
        {"svc_quota_period": "3600s"},  # the same cap per hour instead of per day
        {"svc_quota_period": "172800s"},  # fixed windows that do not line up with the parent's
    ],
)
def test_spec_limits_other_raised_caps_are_refused(over: dict[str, Any]) -> None:
    refused(two_links(**over), "cap-raised")


def test_spec_limits_lifetime_child_period_is_narrower() -> None:
    assert verify(two_links(svc_quota_period=DROP)).caps.quota_period_s is None


def test_spec_limits_child_may_not_add_a_period_to_a_lifetime_cap() -> None:
    parent = authority(PRINCIPAL, svc_quota_period=DROP)
    refused(chain(parent, link(1, PRINCIPAL, AGENT)), "cap-raised")


# --- Step 3: holder binding --------------------------------------------------------------------------


def test_spec_step3_holder_mismatch_is_refused() -> None:
    refused(two_links(), "holder-mismatch", holder=PRINCIPAL)
    refused(authority(AGENT), "holder-mismatch", holder=MALLORY)


# --- Step 4 and "States": exp of every JWT -----------------------------------------------------------


def test_spec_step4_expired_middle_link_is_refused() -> None:
    # The final link cannot outlive the middle one, so it shares the expiry; the middle fails first.
    token = chain(
        authority(PRINCIPAL),
        link(1, PRINCIPAL, AGENT, exp=NOW - 60),
        link(2, AGENT, SUBAGENT, exp=NOW - 60),
    )
    error = refused(token, "expired", holder=SUBAGENT)
    assert error.detail.startswith("link 1:")


def test_rfc7519_4_1_4_exp_equal_to_now_is_expired() -> None:
    refused(authority(AGENT, exp=NOW), "expired")
    verify(authority(AGENT, exp=NOW + 1))


@pytest.mark.parametrize("claim", ["exp", "nbf", "iat"])
def test_numeric_dates_are_capped_to_the_rfc3339_range(claim: str) -> None:
    # Every NumericDate is shown as RFC 3339 (four-digit years): one past 9999 is refused, not shown.
    past_9999 = delegation.NUMERIC_DATE_MAX + 1
    before_0001 = delegation.NUMERIC_DATE_MIN - 1
    for value in (past_9999, before_0001, 2**53, delegation.NUMERIC_DATE_MIN - 0.5):
        over: dict[str, Any] = {claim: value}
        error = refused(authority(AGENT, **over), "bad-claim-value")
        assert error.detail == (
            f"link 0: {claim} is out of range (a NumericDate from 0001-01-01T00:00:00Z to "
            "9999-12-31T23:59:59Z)"
        )
    assert delegation.NUMERIC_DATE_MAX == 253_402_300_799  # 9999-12-31T23:59:59Z
    assert delegation.NUMERIC_DATE_MIN == -62_135_596_800  # 0001-01-01T00:00:00Z
    if claim == "exp":
        last = verify(authority(AGENT, exp=delegation.NUMERIC_DATE_MAX + 0.5))
        assert last.expires_at == delegation.NUMERIC_DATE_MAX + 0.5
    else:
        earliest: dict[str, Any] = {claim: delegation.NUMERIC_DATE_MIN}
        verify(authority(AGENT, **earliest))


def test_numeric_date_cap_holds_for_builders_and_children() -> None:
    with pytest.raises(DelegationError) as info:
        issue_authority(
            OWNER, iss="o", holder_jkt=AGENT.thumbprint, now=NOW, exp=delegation.NUMERIC_DATE_MAX + 1
        )
    assert info.value.reason == "bad-claim-value"
    refused(two_links(exp=delegation.NUMERIC_DATE_MAX + 1), "bad-claim-value")
    with pytest.raises(DelegationError) as info:
        check_chain(chain(authority(PRINCIPAL, exp=300_000_000_000)), now=NOW)
    assert info.value.reason == "bad-claim-value"


def test_rfc7519_4_1_4_leeway_is_bounded() -> None:
    verify(authority(AGENT, exp=NOW), leeway_s=1)
    with pytest.raises(ValueError, match="leeway_s"):
        verify(authority(AGENT), leeway_s=delegation.MAX_LEEWAY_S + 1)


def test_spec_step4_child_outliving_parent_is_refused() -> None:
    refused(two_links(exp=NOW + DAY + 1), "outlives-parent")


def test_spec_step4_child_without_exp_outlives_parent() -> None:
    refused(two_links(exp=DROP), "outlives-parent")


def test_rfc7519_4_1_5_nbf_in_the_future_is_refused() -> None:
    refused(authority(AGENT, nbf=NOW + 1), "not-yet-valid")
    verify(authority(AGENT, nbf=NOW))


# --- Claims fail closed (rules 2-4) ------------------------------------------------------------------


def test_spec_rule3_unknown_non_advisory_claim_is_refused() -> None:
    error = refused(two_links(**{"vendor.example:region": "eu"}), "unrecognized-claim")
    assert "vendor.example:region" in error.detail


def test_spec_rule3_advisory_claim_is_accepted() -> None:
    result = verify(two_links(**{"vendor.example:note": "hi", "advisory": ["vendor.example:note"]}))
    assert result.links[1].advisory == ("vendor.example:note",)
    assert result.links[1].extra_claims == {"vendor.example:note": "hi"}


def test_spec_rule3_advisory_only_covers_its_own_jwt() -> None:
    note: dict[str, Any] = {"vendor.example:note": "hi"}
    token = chain(authority(PRINCIPAL, advisory=["vendor.example:note"]), link(1, PRINCIPAL, AGENT, **note))
    refused(token, "unrecognized-claim")


def test_spec_rule3_claims_the_caller_evaluates_become_understood() -> None:
    token = two_links(**{"vendor.example:region": "eu"})
    result = verify(token, understood_claims=["vendor.example:region"])
    assert result.links[1].extra_claims == {"vendor.example:region": "eu"}


@pytest.mark.parametrize(
    ("advisory", "reason"),
    [
        (["exp"], "bad-claim-value"),  # a registered claim is binding by definition
        (["svc_max_accesses"], "bad-claim-value"),
        (["advisory"], "bad-claim-value"),
        ([""], "bad-claim-value"),
        ("vendor.example:note", "bad-claim-type"),
        ([1], "bad-claim-type"),
    ],
)
def test_spec_rule3_advisory_list_cannot_waive_binding_claims(advisory: Any, reason: str) -> None:
    refused(two_links(advisory=advisory), reason)


def test_spec_rule2_unknown_svc_claim_is_refused() -> None:
    refused(two_links(svc_max_bytes="1"), "reserved-claim")


def test_spec_rule2_svc_claim_cannot_be_made_advisory() -> None:
    refused(two_links(svc_max_bytes="1", advisory=["svc_max_bytes"]), "bad-claim-value")


def test_spec_rule4_spend_cap_accepts_proto_json_string_and_json_integer() -> None:
    as_string = verify(authority(AGENT, svc_max_spend_cents="9223372036854775807"))
    as_number = verify(authority(AGENT, svc_max_spend_cents=9223372036854775807))
    assert as_string.caps.max_spend_cents == as_number.caps.max_spend_cents == delegation.INT64_MAX


@pytest.mark.parametrize(
    ("claim", "value", "reason"),
    [
        ("svc_max_spend_cents", 12.5, "bad-claim-type"),
        ("svc_max_spend_cents", "12.5", "bad-claim-type"),
        ("svc_max_spend_cents", "1e3", "bad-claim-type"),
        ("svc_max_spend_cents", "012", "bad-claim-type"),
        ("svc_max_spend_cents", " 12", "bad-claim-type"),
        ("svc_max_spend_cents", "12\n", "bad-claim-type"),
        ("svc_max_spend_cents", True, "bad-claim-type"),
        ("svc_max_spend_cents", None, "bad-claim-type"),
        ("svc_max_spend_cents", "-1", "bad-claim-value"),
        ("svc_max_spend_cents", "9223372036854775808", "bad-claim-value"),
        ("svc_max_spend_cents", -1, "bad-claim-value"),
        ("svc_max_accesses", "10", "bad-claim-type"),
        ("svc_max_accesses", 10.0, "bad-claim-type"),
        ("svc_max_accesses", False, "bad-claim-type"),
        ("svc_max_accesses", 2**31, "bad-claim-value"),
        ("svc_max_accesses", -1, "bad-claim-value"),
        ("svc_quota_period", 3600, "bad-claim-type"),
        ("svc_quota_period", "3600", "bad-claim-type"),
        ("svc_quota_period", "1.5s", "bad-claim-type"),
        ("svc_quota_period", "-5s", "bad-claim-type"),
        ("svc_quota_period", "0s", "bad-claim-value"),
        ("svc_quota_period", f"{delegation.DURATION_MAX_S + 1}s", "bad-claim-value"),
    ],
)
def test_spec_rule4_svc_claim_with_wrong_type_or_range_is_refused(
    claim: str, value: Any, reason: str
) -> None:
    refused(authority(AGENT, **{claim: value}), reason)


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"exp": "1700003600"}, "bad-claim-type"),
        ({"exp": True}, "bad-claim-type"),
        ({"nbf": [NOW]}, "bad-claim-type"),
        ({"iat": "now"}, "bad-claim-type"),
        ({"scope": ["dist:*"]}, "bad-claim-type"),
        ({"scope": "dist:*  news"}, "bad-claim-value"),
        ({"scope": ""}, "bad-claim-value"),
        ({"iss": DROP}, "missing-claim"),
        ({"iss": 5}, "bad-claim-type"),
        ({"iss": ""}, "bad-claim-value"),
        ({"sub": 5}, "bad-claim-type"),
        ({"jti": 5}, "bad-claim-type"),
        ({"aud": 5}, "bad-claim-type"),
        ({"aud": []}, "bad-claim-type"),
        ({"cnf": DROP}, "missing-claim"),
        ({"cnf": {}}, "missing-claim"),
        ({"cnf": "jkt"}, "bad-claim-type"),
        ({"cnf": {"jkt": 5}}, "bad-claim-type"),
        ({"cnf": {"jkt": AGENT.thumbprint[:-1]}}, "bad-claim-value"),
        ({"cnf": {"jkt": AGENT.thumbprint[:-1] + "="}}, "bad-claim-value"),
        ({"cnf": {"jkt": AGENT.thumbprint, "jwk": AGENT.public.jwk()}}, "bad-claim-value"),
    ],
)
def test_rfc7519_registered_claims_with_wrong_type_are_refused(over: dict[str, Any], reason: str) -> None:
    refused(authority(AGENT, **over), reason)


def test_rfc7519_4_1_3_audience_must_name_the_verifier() -> None:
    token = authority(AGENT, aud=["https://exchange.example", "https://other.example"])
    refused(token, "audience-mismatch")
    refused(token, "audience-mismatch", audience="https://elsewhere.example")
    assert verify(token, audience="https://exchange.example").links[0].aud == (
        "https://exchange.example",
        "https://other.example",
    )


# --- Wire form and token shape -----------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "~", "a~", "~a", "a~~b"])
def test_chain_wire_form_has_no_empty_links(bad: str) -> None:
    refused(bad if bad != "a~" else authority(AGENT) + "~", "malformed-chain")


def test_chain_length_is_bounded() -> None:
    too_many = "~".join([authority(AGENT)] * (delegation.MAX_CHAIN_LINKS + 1))
    refused(too_many, "malformed-chain")
    assert len(split_chain("~".join(["x"] * delegation.MAX_CHAIN_LINKS))) == delegation.MAX_CHAIN_LINKS


def test_spec_token_must_be_an_eddsa_jwt() -> None:
    refused(sign_jws({"alg": "EdDSA"}, b'{"iss":"x"}', OWNER), "malformed-token")  # typ missing
    unsecured = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0." + b64url_encode(b'{"iss":"x"}') + "."
    refused(unsecured, "unsupported-algorithm")


# --- Builders: issue_authority / extend_chain -----------------------------------------------------


def _issued() -> str:
    return issue_authority(
        OWNER,
        iss="https://owner.example",
        holder_jkt=PRINCIPAL.thumbprint,
        now=NOW,
        scope=["dist:*"],
        exp=NOW + DAY,
        max_spend_cents=10_000,
        max_accesses=100,
        quota_period_s=DAY,
        iat=NOW,
    )


def test_builders_issue_and_extend_three_links() -> None:
    token = extend_chain(
        _issued(),
        PRINCIPAL,
        holder_jkt=AGENT.thumbprint,
        now=NOW + 0.5,
        scope=["dist:US:*"],  # dist:US would not cover dist:US:CA: no implicit prefix match
        exp=NOW + HOUR,
        max_spend_cents=5_000,
        max_accesses=50,
        quota_period_s=DAY,
    )
    token = extend_chain(
        token,
        AGENT,
        holder_jkt=SUBAGENT.thumbprint,
        now=NOW,
        scope=["dist:US:CA"],
        exp=NOW + HOUR,
        max_spend_cents=1_000,
        max_accesses=10,
    )
    result = verify(token, holder=SUBAGENT)
    assert result.scope == ("dist:US:CA",)
    assert result.caps == Caps(max_spend_cents=1_000, max_accesses=10, quota_period_s=None)
    assert result.links[1].iss == THUMBPRINT_URI_PREFIX + PRINCIPAL.thumbprint
    assert result.links[1].iat == NOW


def test_builders_use_proto_json_for_svc_claims() -> None:
    [entry] = inspect_chain(_issued())
    assert entry["header"] == {"alg": "EdDSA", "typ": "JWT"}
    claims = entry["claims"]
    assert claims["svc_max_spend_cents"] == "10000"
    assert claims["svc_max_accesses"] == 100
    assert claims["svc_quota_period"] == "86400s"
    assert claims["cnf"] == {"jkt": PRINCIPAL.thumbprint}
    assert claims["scope"] == "dist:*"


def test_builders_child_header_jwk_is_exactly_kty_crv_x() -> None:
    token = extend_chain(_issued(), PRINCIPAL, holder_jkt=AGENT.thumbprint, now=NOW, **_narrow())
    child = inspect_chain(token)[1]
    assert child["header"]["jwk"] == {"kty": "OKP", "crv": "Ed25519", "x": PRINCIPAL.public.jwk()["x"]}
    assert child["signer_jkt"] == PRINCIPAL.thumbprint


def _narrow(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "scope": ["dist:US"],
        "exp": NOW + HOUR,
        "max_spend_cents": 5_000,
        "max_accesses": 50,
        "quota_period_s": DAY,
    }
    return {**base, **over}


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"scope": ["dist:US", "news"]}, "scope-widened"),
        ({"scope": None}, "scope-widened"),
        ({"max_spend_cents": 10_001}, "cap-raised"),
        ({"max_accesses": None}, "cap-raised"),
        ({"quota_period_s": HOUR}, "cap-raised"),
        ({"exp": NOW + DAY + 1}, "outlives-parent"),
        ({"exp": NOW}, "expired"),
        ({"max_accesses": 2**31}, "bad-claim-value"),
    ],
)
def test_builders_extend_refuses_to_widen(over: dict[str, Any], reason: str) -> None:
    with pytest.raises(DelegationError) as info:
        extend_chain(_issued(), PRINCIPAL, holder_jkt=AGENT.thumbprint, now=NOW, **_narrow(**over))
    assert info.value.reason == reason


def test_builders_extend_refuses_a_principal_the_chain_does_not_name() -> None:
    with pytest.raises(DelegationError) as info:
        extend_chain(_issued(), MALLORY, holder_jkt=AGENT.thumbprint, now=NOW, **_narrow())
    assert info.value.reason == "signer-not-named-by-parent"


def test_builders_extend_refuses_an_expired_chain() -> None:
    with pytest.raises(DelegationError) as info:
        extend_chain(_issued(), PRINCIPAL, holder_jkt=AGENT.thumbprint, now=NOW + DAY, **_narrow())
    assert info.value.reason == "expired"


def test_builders_issue_refuses_what_a_verifier_would_refuse() -> None:
    with pytest.raises(DelegationError) as info:
        issue_authority(OWNER, iss="o", holder_jkt="not-a-thumbprint", now=NOW)
    assert info.value.reason == "bad-claim-value"
    with pytest.raises(DelegationError) as info:
        issue_authority(OWNER, iss="o", holder_jkt=AGENT.thumbprint, now=NOW, extra_claims={"svc_x": 1})
    assert info.value.reason == "reserved-claim"
    with pytest.raises(ValueError, match="keyword"):
        issue_authority(OWNER, iss="o", holder_jkt=AGENT.thumbprint, now=NOW, extra_claims={"exp": 1})
    with pytest.raises(ValueError, match="at least one"):
        issue_authority(OWNER, iss="o", holder_jkt=AGENT.thumbprint, now=NOW, scope=[])


@pytest.mark.parametrize(("exp", "reason"), [(NOW, "expired"), (NOW - DAY, "expired"), (NOW + 1, None)])
def test_builders_issue_refuses_an_exp_not_after_now(exp: int, reason: str | None) -> None:
    # The time check extend_chain runs on a child: never sign an authority JWT already expired.
    if reason is None:
        assert verify(issue_authority(OWNER, iss="o", holder_jkt=AGENT.thumbprint, now=NOW, exp=exp))
        return
    with pytest.raises(DelegationError) as info:
        issue_authority(OWNER, iss="o", holder_jkt=AGENT.thumbprint, now=NOW, exp=exp)
    assert (info.value.reason, info.value.detail) == (reason, "link 0: exp is not after the current time")
    with pytest.raises(DelegationError) as info:
        issue_authority(OWNER, iss="o", holder_jkt=AGENT.thumbprint, now=NOW, extra_claims={"nbf": NOW + DAY})
    assert info.value.reason == "not-yet-valid"


def test_builders_issue_extra_claims_are_binding_unless_advisory() -> None:
    token = issue_authority(
        OWNER, iss="o", holder_jkt=AGENT.thumbprint, now=NOW, extra_claims={"vendor.example:tier": "gold"}
    )
    refused(token, "unrecognized-claim")
    advisory = issue_authority(
        OWNER,
        iss="o",
        holder_jkt=AGENT.thumbprint,
        now=NOW,
        extra_claims={"vendor.example:tier": "gold"},
        advisory=["vendor.example:tier"],
    )
    assert verify(advisory).links[0].extra_claims == {"vendor.example:tier": "gold"}


def test_inspect_chain_decodes_without_verifying() -> None:
    token = chain(authority(PRINCIPAL, signer=MALLORY), link(1, PRINCIPAL, AGENT))
    entries = inspect_chain(token)
    assert [e["index"] for e in entries] == [0, 1]
    assert entries[0]["signer_jkt"] is None  # the authority's signer is only known to a verifier
    assert entries[1]["claims"]["cnf"] == {"jkt": AGENT.thumbprint}
    with pytest.raises(DelegationError) as info:
        inspect_chain(token + "~")
    assert info.value.reason == "malformed-chain"


def _hostile_child(claims: dict[str, Any]) -> str:
    """An owner-signed root for PRINCIPAL, and a child link PRINCIPAL signs with ``claims``."""
    root = sign_jwt({"iss": "https://owner.example", "cnf": {"jkt": PRINCIPAL.thumbprint}}, OWNER)
    payload = json.dumps({"iss": "p", "cnf": {"jkt": AGENT.thumbprint}, **claims})  # escapes as JSON may
    header = {"alg": "EdDSA", "typ": "JWT", "jwk": PRINCIPAL.public.jwk()}
    return root + "~" + sign_jws(header, payload.encode("ascii"), PRINCIPAL)


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"svc_max_spend_cents": "9" * 5000}, "bad-claim-value"),  # int() refuses past 4,300 digits
        ({"svc_quota_period": "9" * 5000 + "s"}, "bad-claim-value"),
        ({"svc_max_spend_cents": "9" * 20}, "bad-claim-value"),
        ({"exp": 10**400}, "bad-claim-value"),  # a JSON integer no float holds: an OverflowError later
        ({"nbf": -(10**30)}, "bad-claim-value"),
        ({"sub": "\ud800"}, "malformed-token"),  # a lone surrogate: no header can carry it
        ({"iss": "a\udc00b"}, "malformed-token"),
    ],
)
def test_a_hostile_link_is_refused_with_a_reason_not_a_builtin_error(
    claims: dict[str, Any], reason: str
) -> None:
    """Each of these raised ValueError, OverflowError or UnicodeEncodeError (in verify_chain, in the
    quota window or in the gateway's headers): an answer of 500 where the spec asks for
    DENIAL_REASON_DELEGATION_INVALID."""
    chain = _hostile_child(claims)
    for check in (
        lambda: verify_chain(chain, owner_keys=[OWNER.public], holder_jkt=AGENT.thumbprint, now=NOW),
        lambda: check_chain(chain, now=NOW),
    ):
        with pytest.raises(DelegationError) as caught:
            check()
        assert caught.value.reason == reason


def test_a_surrogate_pair_escape_is_text_and_accepted() -> None:
    chain = _hostile_child({"sub": "\ud83d\ude00"})  # one character, escaped as JSON may escape it
    verified = verify_chain(chain, owner_keys=[OWNER.public], holder_jkt=AGENT.thumbprint, now=NOW)
    assert verified.links[1].sub == "\U0001f600"
