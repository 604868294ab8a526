"""Bound retrieval URLs (spec "Bound retrieval URLs") and the presented key (draft-hardt-httpbis-
signature-key ``hwk``), sans-IO: the URL signature's format, the transaction response reader, and the
``Signature-Key`` member, each refusal with its stable reason."""

from __future__ import annotations

import json

import pytest

from signing_proxy.core.errors import FieldError, ProtocolError, VerificationError
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.retrieval import (
    MAX_BINDINGS,
    agent_id_of,
    parse_retrieval_url,
    parse_transaction_response,
    query_param,
    sign_retrieval_url,
)
from signing_proxy.core.signature_key import (
    RETRIEVAL_COMPONENTS,
    parse_presented_key,
    signature_key_member,
)
from signing_proxy.core.signatures import SPEC_COMPONENTS

EXCHANGE = SigningKey.from_seed(b"\x31" * 32)
AGENT = SigningKey.from_seed(b"\x32" * 32)
OTHER = SigningKey.from_seed(b"\x33" * 32)
EXPIRES = 1_800_000_600
BASE = "https://cdn.example/objects/42"


def signed(url: str = BASE, agent: SigningKey = AGENT) -> str:
    return sign_retrieval_url(url, EXCHANGE, agent_id=agent.thumbprint, expires=EXPIRES)


# --- the URL signature --------------------------------------------------------------------------


def test_a_signed_url_names_its_binding_and_verifies_with_the_exchange_key() -> None:
    url = signed("https://CDN.example:443/objects/42?v=2")  # signed in canonical form
    assert url.startswith("https://cdn.example/objects/42?v=2&agent_id=" + AGENT.thumbprint)
    bound = parse_retrieval_url(url)
    assert (bound.agent_id, bound.expires, bound.keyid) == (AGENT.thumbprint, EXPIRES, EXCHANGE.thumbprint)
    assert bound.verify(EXCHANGE.public)
    assert not bound.verify(OTHER.public)
    assert agent_id_of(url.split("cdn.example", 1)[1]) == AGENT.thumbprint


def test_a_url_rebound_to_another_key_no_longer_verifies() -> None:
    url = signed().replace(AGENT.thumbprint, OTHER.thumbprint)
    assert not parse_retrieval_url(url).verify(EXCHANGE.public)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda u: u.replace("&sig=", "&sig=A"), "malformed-retrieval-url"),  # not 64 bytes
        (lambda u: u + "&x=1", "malformed-retrieval-url"),  # sig not last
        (lambda u: u.replace("?agent_id", "?agent_id=x&agent_id"), "malformed-retrieval-url"),
        (lambda u: u.replace("agent_id=", "agent=", 1), "retrieval-url-unbound"),
        (lambda u: u.replace("expires=", "expires=-", 1), "malformed-retrieval-url"),
        (lambda u: u.replace("keyid=", "keyid=z", 1), "malformed-retrieval-url"),
        (lambda u: u + "é", "malformed-retrieval-url"),
        (lambda u: u.split("?")[0] + "&sig=" + u.rsplit("&sig=", 1)[1], "malformed-retrieval-url"),
    ],
)
def test_malformed_urls_are_refused_before_any_key_is_needed(mutate: object, reason: str) -> None:
    with pytest.raises(VerificationError) as info:
        parse_retrieval_url(mutate(signed()))  # type: ignore[operator]
    assert info.value.reason == reason


def test_signing_refuses_a_url_that_already_carries_a_binding() -> None:
    with pytest.raises(FieldError):
        signed(BASE + "?sig=x")


def test_query_param_is_raw_and_refuses_repeats() -> None:
    assert query_param("/a?x=1&y=%2F", "y") == "%2F"
    assert query_param("/a?x=1&x=2", "x") is None
    assert query_param("/a", "x") is None
    assert agent_id_of("/a?agent_id=short") is None


# --- reading an ExecuteTransaction response -----------------------------------------------------


def test_retrieval_endpoints_are_found_anywhere_in_either_shape() -> None:
    first, second = signed(BASE + "?n=1"), signed(BASE + "?n=2")
    body = json.dumps(
        {
            "agent_identity_hash": AGENT.thumbprint,
            "results": [
                {"retrieval_endpoint": first, "expires_at": "2027-01-15T08:10:00Z"},
                {"item": {"retrieval_endpoint": {"url": second, "expires_at": "2027-01-15T08:20:00Z"}}},
                {"retrieval_endpoint": "https://cdn.example/bearer?sig=x"},  # unbound: ignored
                {"retrieval_endpoint": 42},
            ],
        }
    ).encode()
    result = parse_transaction_response(body)
    assert result.agent_identity_hash == AGENT.thumbprint
    found = {b.url: (b.agent_id, b.expires_at) for b in result.bindings}
    assert found == {
        first: (AGENT.thumbprint, 1_800_000_600),  # 2027-01-15T08:10:00Z
        second: (AGENT.thumbprint, 1_800_001_200),
    }


def test_without_expires_at_the_urls_own_expiry_is_used() -> None:
    result = parse_transaction_response(json.dumps({"retrieval_endpoint": signed()}).encode())
    assert [b.expires_at for b in result.bindings] == [EXPIRES]
    assert result.agent_identity_hash is None


def test_bindings_read_from_one_response_are_bounded() -> None:
    many = [{"retrieval_endpoint": signed(f"{BASE}?n={i}")} for i in range(MAX_BINDINGS + 5)]
    assert len(parse_transaction_response(json.dumps({"r": many}).encode()).bindings) == MAX_BINDINGS


@pytest.mark.parametrize("body", [b"", b"[]", b"not json", b"\xff", b"[" * 100_000])
def test_a_response_that_is_not_a_json_object_is_refused(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_transaction_response(body)


# --- the presented key (Signature-Key, hwk) -----------------------------------------------------


def test_the_presented_key_round_trips_and_is_covered_as_a_sixth_component() -> None:
    member = signature_key_member("agent", AGENT.public)
    assert member == f'agent=hwk;kty="OKP";crv="Ed25519";x="{AGENT.public.jwk()["x"]}";alg="Ed25519"'
    assert parse_presented_key(member, "agent") == AGENT.public
    assert parse_presented_key('other=hwk;kty="OKP", ' + member, "agent") == AGENT.public
    assert RETRIEVAL_COMPONENTS[:5] == SPEC_COMPONENTS
    assert RETRIEVAL_COMPONENTS[5].name == "signature-key"


def test_a_key_without_alg_is_accepted_as_drafts_before_08_sent_it() -> None:
    x = AGENT.public.jwk()["x"]
    assert parse_presented_key(f'agent=hwk;kty="OKP";crv="Ed25519";x="{x}"', "agent") == AGENT.public


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "signature-key-missing"),
        ('relay=hwk;kty="OKP";crv="Ed25519";x="{x}"', "signature-key-missing"),
        ('agent="hwk";kty="OKP";crv="Ed25519";x="{x}"', "unsupported-signature-key-scheme"),
        ('agent=jwks_uri;id="https://a.example";kid="k"', "unsupported-signature-key-scheme"),
        ('agent=hwk;kty="OKP";crv="Ed25519";x="{x}";alg="EdDSA"', "unsupported-signature-key"),
        ('agent=hwk;kty="OKP";crv="Ed25519";x="{x}";kid="k1"', "unsupported-signature-key"),
        ('agent=hwk;kty="EC";crv="P-256";x="{x}";y="{x}"', "unsupported-signature-key"),
        ('agent=hwk;kty="OKP";crv="Ed25519";x="AAAA"', "malformed-signature-key"),
        ('agent=hwk;kty="OKP";crv="Ed25519"', "malformed-signature-key"),
        ("agent=(hwk)", "malformed-signature-key"),
        ("agent=hwk, agent=hwk", "malformed-signature-key"),
        ("agent=hwk;" + "a" * 5000, "malformed-signature-key"),
        ("not a dictionary!", "malformed-signature-key"),
    ],
)
def test_presented_keys_the_check_cannot_use_are_refused(value: str | None, reason: str) -> None:
    text = None if value is None else value.replace("{x}", AGENT.public.jwk()["x"])
    with pytest.raises(VerificationError) as info:
        parse_presented_key(text, "agent")
    assert (info.value.reason, info.value.label) == (reason, "agent")
