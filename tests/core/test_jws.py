"""Compact JWS with EdDSA (RFC 7515, RFC 8037 appendix A.4/A.5) and the JWT layer (RFC 7519)."""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import FrozenInstanceError
from typing import Any

import pytest

from signing_proxy.core import jws
from signing_proxy.core.b64 import b64url_encode
from signing_proxy.core.errors import DelegationError
from signing_proxy.core.jwk import SigningKey, public_key_from_jwk
from signing_proxy.core.jws import ParsedJws, parse_jws, parse_jwt, sign_jws, sign_jwt, verify_jws
from tests.conftest import load_vector

A4 = load_vector("rfc8037_jws_eddsa.json")
A4_KEY = SigningKey.from_jwk(A4["key"]["jwk_private"])
A4_PUBLIC = public_key_from_jwk({k: v for k, v in A4["key"]["jwk_private"].items() if k != "d"})
OTHER_KEY = SigningKey.from_seed(bytes(range(32)))


def _raw_jws(header: bytes, payload: bytes, key: SigningKey = OTHER_KEY) -> str:
    """A correctly signed JWS over arbitrary header bytes, to test what the parser refuses."""
    signing_input = b64url_encode(header) + "." + b64url_encode(payload)
    return signing_input + "." + b64url_encode(key.sign(signing_input.encode("ascii")))


def _refused(token: str, reason: str, parse: Any = parse_jws) -> DelegationError:
    with pytest.raises(DelegationError) as info:
        parse(token)
    assert info.value.reason == reason
    assert info.value.denial_reason == "DENIAL_REASON_DELEGATION_INVALID"
    return info.value


def test_public_api_is_pinned() -> None:
    assert set(jws.__all__) == {
        "ALG",
        "ED25519_SIGNATURE_BYTES",
        "JWT_TYP",
        "MAX_JWS_CHARS",
        "UNDERSTOOD_CRIT",
        "ParsedJws",
        "ParsedJwt",
        "parse_jws",
        "parse_jwt",
        "sign_jws",
        "sign_jwt",
        "unique_members",  # the duplicate-name JSON hook, shared with core.gateway_ingest
        "verify_jws",
    }


# --- RFC 8037 appendix A.4 / A.5 -----------------------------------------------------------------


def test_rfc8037_a4_sign_reproduces_the_vector_byte_for_byte() -> None:
    token = sign_jws({"alg": "EdDSA"}, A4["payload_utf8"].encode("utf-8"), A4_KEY)
    assert token == A4["compact"]
    header_b64, payload_b64, signature_b64 = token.split(".")
    assert header_b64 == A4["protected_header_b64url"]
    assert payload_b64 == A4["payload_b64url"]
    assert signature_b64 == A4["signature_b64url"]


def test_rfc8037_a5_verify_accepts_the_vector() -> None:
    parsed = parse_jws(A4["compact"])
    assert parsed.header == json.loads(A4["protected_header_json"])
    assert parsed.payload == A4["payload_utf8"].encode("utf-8")
    assert parsed.signing_input == A4["signing_input"].encode("ascii")
    assert parsed.parts == tuple(A4["compact"].split("."))
    verify_jws(parsed, A4_PUBLIC)


def test_rfc8037_a5_verify_refuses_another_key() -> None:
    with pytest.raises(DelegationError) as info:
        verify_jws(parse_jws(A4["compact"]), OTHER_KEY.public)
    assert info.value.reason == "bad-signature"


def test_rfc8037_a4_token_is_not_a_jwt() -> None:
    # No typ and a non-JSON payload: valid JWS, refused by the JWT layer.
    _refused(A4["compact"], "malformed-token", parse=parse_jwt)


def test_parsed_jws_is_frozen() -> None:
    parsed = parse_jws(A4["compact"])
    with pytest.raises(FrozenInstanceError):
        parsed.payload = b"x"  # type: ignore[misc]


# --- RFC 7515 section 7.1: strict compact serialization ------------------------------------------


def test_rfc7515_7_1_padding_is_refused() -> None:
    header, payload, signature = A4["compact"].split(".")
    assert len(payload) % 4 == 3  # the padded spelling of the same bytes ends in one "="
    _refused(f"{header}.{payload}=.{signature}", "malformed-token")
    _refused(f"{header}.{payload}.{signature}==", "malformed-token")


def test_rfc7515_7_1_two_parts_are_refused() -> None:
    header, payload, _signature = A4["compact"].split(".")
    error = _refused(f"{header}.{payload}", "malformed-token")
    assert "3 parts" in error.detail


def test_rfc7515_7_1_four_parts_are_refused() -> None:
    _refused(A4["compact"] + ".AAAA", "malformed-token")


def test_rfc7515_2_non_canonical_base64url_is_refused() -> None:
    # The last character of a 64-byte signature carries 4 unused bits; setting one gives a second
    # spelling that lenient decoders map to the same bytes.
    token = A4["compact"]
    assert token.endswith("g")
    _refused(token[:-1] + "h", "malformed-token")


def test_rfc7515_2_standard_base64_alphabet_is_refused() -> None:
    header, payload, signature = A4["compact"].split(".")
    assert "_" in signature
    _refused(f"{header}.{payload}.{signature.replace('_', '/')}", "malformed-token")


def test_rfc7515_7_1_whitespace_and_non_ascii_are_refused() -> None:
    header, payload, signature = A4["compact"].split(".")
    _refused(f"{header}.{payload[:4]} {payload[4:]}.{signature}", "malformed-token")
    _refused(A4["compact"] + "é", "malformed-token")


def test_empty_parts_are_refused() -> None:
    header, payload, signature = A4["compact"].split(".")
    _refused(f"{header}..{signature}", "malformed-token")
    _refused(f"{header}.{payload}.", "malformed-token")


def test_oversized_token_is_refused() -> None:
    _refused("a" * (jws.MAX_JWS_CHARS + 1), "malformed-token")


def test_signature_of_wrong_length_is_refused() -> None:
    header, payload, _signature = A4["compact"].split(".")
    _refused(f"{header}.{payload}.{b64url_encode(b'x' * 63)}", "malformed-token")


# --- RFC 7515 section 4.1: header rules ------------------------------------------------------------


def test_rfc8037_alg_none_is_refused() -> None:
    token = _raw_jws(b'{"alg":"none"}', b"payload")
    _refused(token.rsplit(".", 1)[0] + ".", "unsupported-algorithm")  # unsecured JWS, empty signature
    _refused(token, "unsupported-algorithm")


def test_rfc8037_alg_hs256_key_confusion_is_refused() -> None:
    # The classic attack: HMAC keyed with the public key bytes, hoping the verifier picks alg from the header.
    signing_input = b64url_encode(b'{"alg":"HS256","typ":"JWT"}') + "." + b64url_encode(b'{"iss":"x"}')
    mac = hmac.new(A4_PUBLIC.raw, signing_input.encode("ascii"), hashlib.sha256).digest()
    _refused(signing_input + "." + b64url_encode(mac), "unsupported-algorithm")


@pytest.mark.parametrize("header", [b"{}", b'{"alg":"Ed25519"}', b'{"alg":"eddsa"}', b'{"alg":["EdDSA"]}'])
def test_rfc8037_only_alg_eddsa_is_accepted(header: bytes) -> None:
    _refused(_raw_jws(header, b"payload"), "unsupported-algorithm")


def test_rfc7515_4_1_11_unknown_crit_is_refused() -> None:
    _refused(_raw_jws(b'{"alg":"EdDSA","crit":["exp"],"exp":1}', b"payload"), "unsupported-critical-header")


@pytest.mark.parametrize("crit", [b"[]", b'"exp"', b"[1]"])
def test_rfc7515_4_1_11_malformed_crit_is_refused(crit: bytes) -> None:
    _refused(_raw_jws(b'{"alg":"EdDSA","crit":' + crit + b"}", b"payload"), "malformed-token")


def test_rfc7797_unencoded_payload_is_refused() -> None:
    _refused(
        _raw_jws(b'{"alg":"EdDSA","b64":false,"crit":["b64"]}', b"payload"), "unsupported-critical-header"
    )
    _refused(_raw_jws(b'{"alg":"EdDSA","b64":false}', b"payload"), "unsupported-critical-header")


def test_rfc7515_5_2_duplicate_header_member_is_refused() -> None:
    _refused(_raw_jws(b'{"alg":"EdDSA","alg":"none"}', b"payload"), "malformed-token")


@pytest.mark.parametrize("header", [b'["EdDSA"]', b'"EdDSA"', b"\xff", b'\xef\xbb\xbf{"alg":"EdDSA"}', b"{"])
def test_rfc7515_header_must_be_a_utf8_json_object(header: bytes) -> None:
    _refused(_raw_jws(header, b"payload"), "malformed-token")


def test_rfc7515_5_2_tampered_payload_fails_verification() -> None:
    header, _payload, signature = A4["compact"].split(".")
    forged = parse_jws(f"{header}.{b64url_encode(b'Example of Ed25519 signinG')}.{signature}")
    with pytest.raises(DelegationError) as info:
        verify_jws(forged, A4_PUBLIC)
    assert info.value.reason == "bad-signature"


def test_rfc7515_5_2_tampered_signature_fails_verification() -> None:
    parsed = parse_jws(A4["compact"])
    flipped = bytes([parsed.signature[0] ^ 1]) + parsed.signature[1:]
    header, payload, _signature = parsed.parts
    with pytest.raises(DelegationError) as info:
        verify_jws(parse_jws(f"{header}.{payload}.{b64url_encode(flipped)}"), A4_PUBLIC)
    assert info.value.reason == "bad-signature"


def test_sign_jws_refuses_headers_it_would_not_accept() -> None:
    with pytest.raises(ValueError, match="alg"):
        sign_jws({"alg": "none"}, b"payload", A4_KEY)
    with pytest.raises(ValueError, match="critical"):
        sign_jws({"alg": "EdDSA", "crit": ["x"], "x": 1}, b"payload", A4_KEY)


# --- RFC 7519: the JWT layer -----------------------------------------------------------------------


def test_rfc7519_sign_jwt_header_and_round_trip() -> None:
    token = sign_jwt({"iss": "https://owner.example", "exp": 1}, OTHER_KEY, {"kid": "k1"})
    header_b64, payload_b64, _signature = token.split(".")
    assert header_b64 == b64url_encode(b'{"alg":"EdDSA","typ":"JWT","kid":"k1"}')
    assert payload_b64 == b64url_encode(b'{"iss":"https://owner.example","exp":1}')
    parsed = parse_jwt(token)
    assert parsed.header == {"alg": "EdDSA", "typ": "JWT", "kid": "k1"}
    assert parsed.claims == {"iss": "https://owner.example", "exp": 1}
    verify_jws(parsed.jws, OTHER_KEY.public)


def test_rfc7519_sign_jwt_refuses_overriding_alg_or_typ() -> None:
    with pytest.raises(ValueError, match="alg"):
        sign_jwt({}, OTHER_KEY, {"alg": "none"})
    with pytest.raises(ValueError, match="typ"):
        sign_jwt({}, OTHER_KEY, {"typ": "at+jwt"})


def test_rfc7519_5_1_jwt_without_typ_is_refused() -> None:
    error = _refused(sign_jws({"alg": "EdDSA"}, b'{"iss":"x"}', OTHER_KEY), "malformed-token", parse_jwt)
    assert "typ" in error.detail


@pytest.mark.parametrize("typ", ["jwt", "at+jwt", "JOSE"])
def test_spec_jwt_typ_must_be_exactly_jwt(typ: str) -> None:
    _refused(sign_jws({"alg": "EdDSA", "typ": typ}, b'{"iss":"x"}', OTHER_KEY), "malformed-token", parse_jwt)


@pytest.mark.parametrize(
    "payload",
    [b'["iss"]', b'"iss"', b"not json", b'{"iss":"a","iss":"b"}', b'{"exp":NaN}', b'{"exp":1e999}', b"\xff"],
)
def test_rfc7519_7_2_claims_must_be_a_strict_json_object(payload: bytes) -> None:
    token = _raw_jws(b'{"alg":"EdDSA","typ":"JWT"}', payload)
    _refused(token, "malformed-token", parse_jwt)


def test_parsed_jws_type_is_exported() -> None:
    assert isinstance(parse_jws(A4["compact"]), ParsedJws)
