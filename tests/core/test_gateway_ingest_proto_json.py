"""core.gateway_ingest reads proto-JSON as the proto3 JSON mapping defines it: a ``bytes`` value in
either base64 alphabet, padded or not ("Either standard or URL-safe base64 encoding with/without
paddings are accepted"), and ``null`` for any field as its default. Valid bodies of another
implementation were refused. Still strict: one alphabet, exact padding, canonical trailing bits;
a required member's ``null`` is refused as its absence is."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from signing_proxy.core.errors import DelegationError
from signing_proxy.core.gateway_ingest import IngestError, ingest_requester, read_delegation

# The '~' bytes put '+' and '/' into standard base64 ('-' and '_' into URL-safe); 34 bytes: padded "==".
CHAIN = "eyJh.eyJi.c2ln~~~?~eyJj.eyJk.c2lu0"
STANDARD = base64.b64encode(CHAIN.encode()).decode()
URL_SAFE = base64.urlsafe_b64encode(CHAIN.encode()).decode()
DELEGATION = {
    "token": STANDARD,
    "principal_domain": "corp.example",
    "principal_id": "alice",
    "expires_at": "2030-01-01T00:00:00Z",
}


def test_the_spellings_differ_as_the_tests_need() -> None:
    assert STANDARD.endswith("=")
    assert {"+", "/"} <= set(STANDARD)
    assert {"-", "_"} <= set(URL_SAFE)


@pytest.mark.parametrize(
    "token", [STANDARD, STANDARD.rstrip("="), URL_SAFE, URL_SAFE.rstrip("=")], ids=lambda t: t[-6:]
)
def test_each_base64_spelling_of_the_token_reads_as_the_same_chain(token: str) -> None:
    """The quota keys hash the decoded chain (``DelegationIn.token``): one chain, one count."""
    assert read_delegation({**DELEGATION, "token": token}).token == CHAIN


def _last_char_with_unused_bits(token: str, alphabet: str) -> str:
    """``token`` with a last data character that decodes the same but sets unused bits."""
    data = token.rstrip("=")
    last = alphabet.index(data[-1])
    return data[:-1] + alphabet[last | 1] + token[len(data) :]


STANDARD_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
URL_SAFE_ALPHABET = STANDARD_ALPHABET[:62] + "-_"


@pytest.mark.parametrize(
    "token",
    [
        STANDARD.replace("/", "_", 1),  # both alphabets
        URL_SAFE.replace("_", "/", 1),
        STANDARD[:8] + "!" + STANDARD[9:],  # outside either alphabet
        STANDARD[:8] + " " + STANDARD[9:],
        STANDARD + "\n",
        URL_SAFE.rstrip("=") + "\u00e9",  # not ASCII
        STANDARD + "=",  # more padding than the length needs
        STANDARD.rstrip("=") + "=",  # less
        "YWJj=",  # padding where none is needed
        STANDARD[:4] + "=" + STANDARD[4:],  # padding inside
        "YWJjZ",  # one character past a group: no byte ends there
        "YWJjZ===",
        _last_char_with_unused_bits(STANDARD, STANDARD_ALPHABET),
        _last_char_with_unused_bits(URL_SAFE.rstrip("="), URL_SAFE_ALPHABET),
        "====",
    ],
)
def test_a_token_in_no_proto_json_spelling_is_refused(token: str) -> None:
    with pytest.raises(DelegationError) as caught:
        read_delegation({**DELEGATION, "token": token})
    assert caught.value.reason == "malformed-delegation"
    assert "token is base64" in caught.value.detail


def test_the_unused_bits_case_really_decodes_to_the_same_bytes() -> None:
    loose = _last_char_with_unused_bits(STANDARD, STANDARD_ALPHABET)
    assert loose != STANDARD
    assert base64.b64decode(loose) == CHAIN.encode()


@pytest.mark.parametrize(
    "name",
    ["scopes", "token_format", "ext_critical", "max_accesses", "max_spend_cents", "quota_period", "issuer"],
)
def test_a_null_optional_delegation_member_reads_as_absent(name: str) -> None:
    delegation = read_delegation({**DELEGATION, name: None})
    assert delegation == read_delegation(DELEGATION)
    assert delegation.scopes == ()


def _body(requester: dict[str, Any], **envelope: Any) -> bytes:
    return json.dumps({"ver": "1.0", **envelope, "requester": requester}).encode()


REQUESTER = {"id": "a", "domain": "d", "type": "REQUESTER_TYPE_AGENT"}


@pytest.mark.parametrize("name", ["scopes", "ext_critical", "delegation"])
def test_a_null_optional_requester_member_reads_as_absent(name: str) -> None:
    requester = ingest_requester(_body({**REQUESTER, name: None}), ())
    assert requester == ingest_requester(_body(REQUESTER), ())
    assert requester.scopes == ()


def test_a_null_ext_critical_in_the_delegation_reads_as_absent() -> None:
    requester = ingest_requester(_body({**REQUESTER, "delegation": {**DELEGATION, "ext_critical": None}}), ())
    assert requester.delegation is not None


@pytest.mark.parametrize("name", ["token", "principal_domain", "principal_id", "expires_at"])
def test_a_null_required_delegation_member_is_refused_as_a_missing_one(name: str) -> None:
    absent = {k: v for k, v in DELEGATION.items() if k != name}
    errors = []
    for doc in (absent, {**DELEGATION, name: None}):
        with pytest.raises(DelegationError) as caught:
            read_delegation(doc)
        errors.append((caught.value.reason, caught.value.detail))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("name", ["id", "domain"])
def test_a_null_required_requester_member_is_refused_as_a_missing_one(name: str) -> None:
    absent = {k: v for k, v in REQUESTER.items() if k != name}
    errors = []
    for requester in (absent, {**REQUESTER, name: None}):
        with pytest.raises(IngestError) as caught:
            ingest_requester(_body(requester), ())
        errors.append((caught.value.reason, caught.value.detail))
    assert errors[0] == errors[1]


def test_a_null_envelope_member_is_refused_as_a_missing_one() -> None:
    for body, reason in (
        (b'{"ver":null,"requester":{}}', "envelope-version-missing"),
        (b'{"ver":"1.0","requester":null}', "requester-missing"),
    ):
        with pytest.raises(IngestError) as caught:
            ingest_requester(body, ())
        assert caught.value.reason == reason
