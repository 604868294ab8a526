"""core.gateway_ingest.check_mirror: a Delegation's mirrored fields are never wider than the verified
token (spec: the token's claims are authoritative). One case per rule, each refused with its reason,
beside a mirror that equals the claims and one that is narrower (both accepted)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from signing_proxy.core.delegation_claims import Caps, VerifiedLink
from signing_proxy.core.delegation_verify import VerifiedDelegation
from signing_proxy.core.errors import DelegationError
from signing_proxy.core.gateway_ingest import (
    ENDLESS_QUOTA_WINDOW_S,
    DelegationIn,
    IngestError,
    check_mirror,
    ingest_requester,
    quota_counters,
    read_delegation,
)

NOW = 1_800_000_000
VERIFIED = VerifiedDelegation(
    links=(),
    scope=("dist:US:*", "subscription:news"),
    caps=Caps(max_spend_cents=1000, max_accesses=10, quota_period_s=86_400),
    holder_jkt="holder",
    expires_at=NOW + 3600,
    owner_jkt="owner",
)
MIRROR = DelegationIn(
    token="t",
    principal_domain="principal.example",
    principal_id="p",
    expires_at=NOW + 3600,
    scopes=("dist:US:*", "subscription:news"),
    max_accesses=10,
    max_spend_cents=1000,
    quota_period_s=86_400,
    issuer=None,
)


@pytest.mark.parametrize(
    "mirror",
    [
        MIRROR,
        dataclasses.replace(
            MIRROR, expires_at=NOW + 60, scopes=("dist:US:CA",), max_accesses=3, max_spend_cents=None
        ),
        dataclasses.replace(MIRROR, quota_period_s=None, max_accesses=None),  # absent: the token decides
    ],
)
def test_a_mirror_no_wider_than_the_token_is_accepted(mirror: DelegationIn) -> None:
    check_mirror(mirror, VERIFIED, NOW)


@pytest.mark.parametrize(
    ("change", "reason", "detail"),
    [
        ({"expires_at": NOW}, "expired", "expires_at has passed"),
        ({"expires_at": NOW + 3601}, "mirror-wider", "later than the token's exp"),
        ({"scopes": ("dist:*",)}, "mirror-wider", "scopes is wider"),
        ({"max_accesses": 11}, "mirror-wider", "cap is wider"),
        ({"max_spend_cents": 1001}, "mirror-wider", "cap is wider"),
        ({"quota_period_s": 3600}, "mirror-wider", "quota_period differs"),
    ],
)
def test_each_wider_mirror_is_refused_with_its_reason(
    change: dict[str, object], reason: str, detail: str
) -> None:
    with pytest.raises(DelegationError) as caught:
        check_mirror(dataclasses.replace(MIRROR, **change), VERIFIED, NOW)  # type: ignore[arg-type]
    assert caught.value.reason == reason
    assert detail in caught.value.detail


@pytest.mark.parametrize("given", ["REQUESTER_TYPE_AGENT", 1, "1"])
def test_a_requester_type_is_read_as_the_proxy_writes_it(given: object) -> None:
    """The gateway reads a RequesterType by the proxy's own rule: its name, or its number."""
    body = json.dumps({"ver": "1.0", "requester": {"id": "a", "domain": "d", "type": given}}).encode()
    assert ingest_requester(body, ()).type == "REQUESTER_TYPE_AGENT"


MALFORMED_SCOPES = [["a b"], [""], ["dist::US"], ["di*"], ['q"uote'], [7], "dist:US"]


@pytest.mark.parametrize("scopes", MALFORMED_SCOPES)
def test_a_malformed_declared_scope_is_refused_at_ingest(scopes: object) -> None:
    """A stranger's malformed scope was accepted here and raised ValueError later, where scopes are
    matched or written into the backend's headers: a 500 with a traceback for every such request."""
    requester = {"id": "a", "domain": "d", "type": "REQUESTER_TYPE_AGENT", "scopes": scopes}
    with pytest.raises(IngestError) as caught:
        ingest_requester(json.dumps({"ver": "1.0", "requester": requester}).encode(), ())
    assert caught.value.reason == "malformed-requester"


@pytest.mark.parametrize("scopes", MALFORMED_SCOPES)
def test_a_malformed_mirrored_scope_is_a_malformed_delegation(scopes: object) -> None:
    with pytest.raises(DelegationError) as caught:
        read_delegation({**DELEGATION, "scopes": scopes})
    assert caught.value.reason == "malformed-delegation"


def test_well_formed_scopes_pass_ingest() -> None:
    requester = {"id": "a", "domain": "d", "type": 1, "scopes": ["dist:US:CA", "dist:*", "subscription:gold"]}
    ingested = ingest_requester(json.dumps({"ver": "1.0", "requester": requester}).encode(), ())
    assert ingested.scopes == ("dist:US:CA", "dist:*", "subscription:gold")


DELEGATION = {
    "token": "YQ==",
    "principal_domain": "corp.example",
    "principal_id": "alice",
    "expires_at": "2030-01-01T00:00:00Z",
}


def test_a_camel_case_alias_is_refused_not_overlooked() -> None:
    """A backend's proto-JSON parser reads ``extCritical`` as ``ext_critical``: had the gateway
    overlooked it, a critical extension it never checked would have reached the backend approved."""
    requester = {"id": "a", "domain": "d", "type": 1, "extCritical": ["x:y"]}
    with pytest.raises(IngestError) as caught:
        ingest_requester(json.dumps({"ver": "1.0", "requester": requester}).encode(), ())
    assert caught.value.reason == "malformed-requester"
    for alias in ("extCritical", "maxAccesses", "quotaPeriod", "principalId", "expiresAt"):
        with pytest.raises(DelegationError) as refused:
            read_delegation({**DELEGATION, alias: "1"})
        assert refused.value.reason == "malformed-delegation"


@pytest.mark.parametrize(
    ("member", "given", "read"),
    [
        ("max_accesses", 5, 5),
        ("max_accesses", "5", 5),  # proto-JSON: an int32 may be a decimal string too
        ("max_accesses", 2**31 - 1, 2**31 - 1),
        ("max_spend_cents", "9223372036854775807", 2**63 - 1),
        ("max_spend_cents", 12, 12),
    ],
)
def test_counts_are_read_as_proto_json_writes_them(member: str, given: object, read: int) -> None:
    assert getattr(read_delegation({**DELEGATION, member: given}), member) == read


@pytest.mark.parametrize(
    ("member", "given"),
    [
        ("max_accesses", 2**31),  # past int32
        ("max_accesses", "2147483648"),
        ("max_spend_cents", "9223372036854775808"),  # past int64
        ("max_accesses", -1),
        ("max_accesses", True),
        ("max_accesses", "05"),
        ("max_accesses", 1.5),
    ],
)
def test_a_count_out_of_its_type_is_a_malformed_delegation(member: str, given: object) -> None:
    with pytest.raises(DelegationError) as caught:
        read_delegation({**DELEGATION, member: given})
    assert caught.value.reason == "malformed-delegation"


def _link(exp: float | None, max_accesses: int | None) -> VerifiedLink:
    return VerifiedLink(
        iss="issuer",
        scope=None,
        exp=exp,
        cnf_jkt="holder",
        caps=Caps(max_accesses=max_accesses),
        signer_jkt="s",
    )


def _chain(*links: VerifiedLink) -> VerifiedDelegation:
    exps = [link.exp for link in links if link.exp is not None]
    return dataclasses.replace(VERIFIED, links=links, expires_at=min(exps) if exps else None)


def test_an_issuer_mirror_must_be_the_tokens_iss() -> None:
    """Delegation.issuer mirrors the authority JWT's iss; naming another issuer is refused."""
    verified = _chain(_link(NOW + 3600, None))
    mirror = dataclasses.replace(MIRROR, max_accesses=None, quota_period_s=None)
    check_mirror(dataclasses.replace(mirror, issuer="issuer"), verified, NOW)
    with pytest.raises(DelegationError) as caught:
        check_mirror(dataclasses.replace(mirror, issuer="https://other.example"), verified, NOW)
    assert (caught.value.reason, caught.value.detail) == (
        "mirror-mismatch",
        "delegation.issuer is not the token's iss",
    )


def test_principal_domain_and_id_mirror_no_claim() -> None:
    """principal_domain names no claim (an OIDC iss names the identity provider): not compared."""
    verified = _chain(_link(NOW + 3600, None))
    mirror = dataclasses.replace(
        MIRROR, principal_domain="elsewhere.example", principal_id="x", max_accesses=None, quota_period_s=None
    )
    check_mirror(mirror, verified, NOW)


@pytest.mark.parametrize("leeway", [0, 30])
def test_a_lifetime_quota_lasts_until_its_links_exp_plus_the_leeway(leeway: int) -> None:
    """A lifetime quota's window is the capped link's exp - now + leeway."""
    chain = _chain(_link(NOW + 3600, 5))
    (counter,) = quota_counters("root", chain, NOW + 100, leeway)
    assert counter.window_s == 3500 + leeway


def test_a_lifetime_quota_ends_with_its_own_link_not_the_chains_shortest() -> None:
    """Each capped link's window runs to that link's exp (or an earlier one above it), never to a
    later link's: the holder issues those, and each new child would start its parent's count again."""
    own = _chain(_link(NOW + 3600, 5), _link(NOW + 600, 2))  # the chain expires at NOW + 600
    assert [c.window_s for c in quota_counters("root~child", own, NOW)] == [3600, 600]
    endless = _chain(_link(None, 5), _link(NOW + 600, None))  # only the root caps, and has no exp
    assert [c.window_s for c in quota_counters("root~child", endless, NOW)] == [ENDLESS_QUOTA_WINDOW_S]


def test_a_lifetime_quota_of_a_chain_that_never_ends_is_kept_a_year_not_for_ever() -> None:
    """No link has exp and none a quota_period: the count had no window, so its stored row (sqlite,
    Redis) was never removed, one per chain any https issuer could sign."""
    chain = _chain(_link(None, 5), _link(None, 2))
    windows = [c.window_s for c in quota_counters("root~child", chain, NOW)]
    assert windows == [ENDLESS_QUOTA_WINDOW_S, ENDLESS_QUOTA_WINDOW_S] == [366 * 86_400] * 2


def test_a_lifetime_quota_window_is_at_least_one_second() -> None:
    """A grant ending in under a second still counts for a 1 s window."""
    chain = _chain(_link(NOW + 0.25, 5))
    (counter,) = quota_counters("root", chain, NOW)
    assert counter.window_s == 1.0


@pytest.mark.parametrize("member", ["id", "domain"])
def test_a_lone_surrogate_escape_is_a_malformed_body(member: str) -> None:
    """``"\\ud800"`` alone reads as a str no UTF-8 (and no header to the backend) can carry: the
    gateway's ``X-Verified-Requester-*`` raised UnicodeEncodeError, a 500 for any signed stranger."""
    requester = {"id": "agent-7", "domain": "d.example", "type": "REQUESTER_TYPE_AGENT"}
    body = json.dumps({"ver": "1.0", "requester": requester}).replace(requester[member], "\\ud800", 1)
    with pytest.raises(IngestError) as caught:
        ingest_requester(body.encode(), ())
    assert caught.value.reason == "malformed-body"
    paired = body.replace("\\ud800", "\\ud83d\\ude00")  # a pair is a character: accepted
    assert ingest_requester(paired.encode(), ()).type == "REQUESTER_TYPE_AGENT"
