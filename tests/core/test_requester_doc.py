"""The Requester/Delegation proto-JSON shapes, the JSON member insertion, and ``check_chain``."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from signing_proxy.core.delegation import check_chain, extend_chain, issue_authority
from signing_proxy.core.errors import DelegationError
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.requester import (
    DelegationDoc,
    RequesterDoc,
    check_ext,
    insert_member,
    parse_duration_s,
    requester_type_name,
)

NOW = 1_700_000_000
OWNER = SigningKey.from_seed(b"\x11" * 32)
PRINCIPAL = SigningKey.from_seed(b"\x12" * 32)
PROXY = SigningKey.from_seed(b"\x13" * 32)


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("REQUESTER_TYPE_AGENT", "REQUESTER_TYPE_AGENT"),
        (1, "REQUESTER_TYPE_AGENT"),
        (2, "REQUESTER_TYPE_HUMAN_TOOL"),
        ("3", "REQUESTER_TYPE_SERVICE"),
        ("REQUESTER_TYPE_DELEGATED", "REQUESTER_TYPE_DELEGATED"),
        (5, "REQUESTER_TYPE_RESEARCH"),
    ],
)
def test_spec_requester_type_by_name_or_number(value: object, name: str) -> None:
    assert requester_type_name(value) == name


@pytest.mark.parametrize("value", ["REQUESTER_TYPE_UNSPECIFIED", 0, "0"])
def test_spec_requester_type_unspecified_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="REQUESTER_TYPE_UNSPECIFIED is rejected at ingest"):
        requester_type_name(value)


@pytest.mark.parametrize("value", ["AGENT", "requester_type_agent", 6, -1, True, None, 1.0, {"x": 1}, [1]])
def test_unknown_requester_types_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match="RequesterType"):
        requester_type_name(value)


def test_spec_proto_json_field_names_and_encodings() -> None:
    chain = "aaa.bbb.ccc~ddd.eee.fff"
    delegation = DelegationDoc(
        principal_domain="corp.example",
        principal_id="alice",
        expires_at=1_800_000_000.9,
        token=chain,
        scopes=("dist:US",),
        max_spend_cents=2**62,
        revocation_uri="https://corp.example/revoked",
        max_accesses=100,
        quota_period_s=86_400,
        issuer="https://corp.example",
        ext={"vendor:x": {"y": [1, 2]}},
        ext_critical=("vendor:x",),
    )
    doc = RequesterDoc(
        id="agent-7",
        domain="agent.example",
        type="REQUESTER_TYPE_DELEGATED",
        name="Research assistant",
        scopes=("dist:US", "subscription:news"),
        delegation=delegation,
        ext={"a": 1},
        ext_critical=("a",),
    ).proto_json()
    # Names and order exactly as the spec's tables.
    assert list(doc) == ["id", "domain", "type", "name", "scopes", "delegation", "ext", "ext_critical"]
    assert list(doc["delegation"]) == [
        "principal_domain",
        "principal_id",
        "scopes",
        "expires_at",
        "max_spend_cents",
        "token",
        "token_format",
        "revocation_uri",
        "max_accesses",
        "quota_period",
        "issuer",
        "ext",
        "ext_critical",
    ]
    d = doc["delegation"]
    assert d["expires_at"] == "2027-01-15T08:00:00Z"  # RFC 3339, fraction floored
    assert d["max_spend_cents"] == str(2**62)  # int64: a JSON string
    assert d["max_accesses"] == 100  # int32: a JSON number
    assert d["quota_period"] == "86400s"  # Duration
    assert base64.b64decode(d["token"], validate=True) == chain.encode("ascii")  # bytes: standard base64
    assert d["token_format"] == "jwt"
    assert doc["type"] == "REQUESTER_TYPE_DELEGATED"  # enum: its name


def test_proto_json_omits_unset_fields() -> None:
    doc = RequesterDoc(id="a", domain="agent.example", type="REQUESTER_TYPE_AGENT").proto_json()
    assert doc == {"id": "a", "domain": "agent.example", "type": "REQUESTER_TYPE_AGENT"}
    d = DelegationDoc("corp.example", "alice", NOW, "a.b.c").proto_json()
    assert set(d) == {"principal_domain", "principal_id", "expires_at", "token", "token_format"}


def test_proto_json_token_is_padded_standard_base64() -> None:
    token = "a" * 7  # 7 bytes: needs padding; standard, not url-safe alphabet
    d = DelegationDoc("corp.example", "alice", NOW, token).proto_json()
    assert d["token"] == base64.b64encode(token.encode()).decode()
    assert d["token"].endswith("=")


@pytest.mark.parametrize(
    ("text", "seconds"), [("86400s", 86_400), ("30m", 1800), ("24h", 86_400), ("30d", 2_592_000)]
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text", ["0s", "1.5s", "-1s", "1w", "", "s", "86400"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration_s(text)


def test_ext_critical_names_keys_of_ext() -> None:
    check_ext({"a": 1}, ("a",), "requester")
    with pytest.raises(ValueError, match=r"requester.ext_critical\[0\]: 'b' is not a key of requester.ext"):
        check_ext({"a": 1}, ("b",), "requester")
    with pytest.raises(ValueError, match="listed twice"):
        check_ext({"a": 1}, ("a", "a"), "requester")


# --- inserting the member -------------------------------------------------------------------------


MEMBER = json.dumps({"id": "a"}, separators=(",", ":"))


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"ver":"1.0"}', b'{"requester":{"id":"a"},"ver":"1.0"}'),
        (b"{}", b'{"requester":{"id":"a"}}'),
        (b" \n{ \t}\n", b' \n{"requester":{"id":"a"} \t}\n'),
        (b'  {\n  "uris": ["x"]\n}\n', b'  {"requester":{"id":"a"},\n  "uris": ["x"]\n}\n'),
    ],
)
def test_insert_keeps_every_other_byte(body: bytes, expected: bytes) -> None:
    out = insert_member(body, "requester", MEMBER)
    assert out == expected
    assert json.loads(out) == {"requester": {"id": "a"}, **json.loads(body)}


def test_insert_keeps_numbers_and_unicode_exactly() -> None:
    body = '{"n": 1.000000000000000000001, "big": 123456789012345678901234567890, "s": "é\\u00e9"}'.encode()
    out = insert_member(body, "requester", MEMBER)
    assert out is not None
    assert out.endswith(body[1:])  # nothing re-encoded


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b'"x"',
        b"null",
        b"not json",
        b'{"requester": null}',
        b'{"a": 1, "requester": {"id": "mine"}}',
        b'{"a": 1, "a": 2}',  # duplicate names: ambiguous, left alone
        b'{"a": NaN}',
        b"\xef\xbb\xbf{}",  # BOM
        b'{"a": "\xff"}',  # not UTF-8
        b"{} {}",
    ],
)
def test_insert_leaves_other_bodies_alone(body: bytes) -> None:
    assert insert_member(body, "requester", MEMBER) is None


def test_nested_requester_does_not_count() -> None:
    out = insert_member(b'{"x": {"requester": 1}}', "requester", MEMBER)
    assert out is not None
    assert json.loads(out)["requester"] == {"id": "a"}


# --- check_chain: what a holder checks without the owner's key ------------------------------------


def _chain(**child: Any) -> str:
    authority = issue_authority(
        OWNER,
        iss="https://owner.example",
        holder_jkt=PRINCIPAL.thumbprint,
        now=NOW,
        scope=["dist:*"],
        exp=NOW + 3600,
    )
    return extend_chain(
        authority,
        PRINCIPAL,
        holder_jkt=PROXY.thumbprint,
        now=NOW,
        scope=child.get("scope", ["dist:US"]),
        exp=child.get("exp", NOW + 600),
    )


def test_check_chain_returns_links_without_verifying_the_authority() -> None:
    links = check_chain(_chain(), now=NOW)
    assert [link.cnf_jkt for link in links] == [PRINCIPAL.thumbprint, PROXY.thumbprint]
    assert links[0].signer_jkt == ""  # not verified: no owner key here
    assert links[1].signer_jkt == PRINCIPAL.thumbprint


def test_check_chain_checks_expiry_and_child_signatures() -> None:
    with pytest.raises(DelegationError) as info:
        check_chain(_chain(), now=NOW + 600)
    assert info.value.reason == "expired"
    head, child = _chain().split("~")
    a, b, c = child.split(".")
    tampered = f"{head}~{a}.{b}.{c[:-2]}{'A' if c[-2] != 'A' else 'B'}{c[-1]}"
    with pytest.raises(DelegationError) as info:
        check_chain(tampered, now=NOW)
    assert info.value.reason in ("signer-not-named-by-parent", "malformed-token")
