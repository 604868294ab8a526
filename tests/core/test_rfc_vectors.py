"""Published vectors, reproduced byte-for-byte (Ed25519 is deterministic)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import pytest

from signing_proxy.core.b64 import b64_encode
from signing_proxy.core.digest import content_digest, parse_content_digest, verify_content_digest
from signing_proxy.core.errors import SigningError, VerificationError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import PublicKey, SigningKey, jwk_thumbprint, thumbprint_of_raw
from signing_proxy.core.signatures import (
    Component,
    Message,
    VerificationKey,
    attach_signature,
    component_value,
    serialize_params_value,
    sign_message,
    signature_base,
    verify_stack,
)
from signing_proxy.core.uri import parse_absolute_uri
from tests.conftest import load_vector

B26 = load_vector("rfc9421_b26_ed25519.json")
DERIVED = load_vector("spec_profile_derived_examples.json")
WBA = load_vector("web_bot_auth_drafts_ed25519.json")


def _components(names: list[str]) -> list[Component]:
    out = []
    for name in names:
        if ";key=" in name:
            bare, key = name.split(";key=")
            out.append(Component(bare.strip('"'), key.strip('"')))
        else:
            out.append(Component(name.strip('"')))
    return out


@pytest.mark.parametrize("vector", B26["vectors"], ids=lambda v: v["id"])
def test_rfc9421_b26_and_b4_reproduce_published_signature(vector: dict[str, Any]) -> None:
    key = SigningKey.from_pem(B26["key"]["pem_private_pkcs8"].encode())
    raw = str(vector.get("request_raw_http", B26["request"]["raw_http"]))
    head = raw.split("\r\n\r\n", 1)[0].split("\r\n")
    method, target, _ = head[0].split(" ")
    lines = Fields((name, value) for name, value in (line.split(": ", 1) for line in head[1:]))
    host = lines.combined("host")
    message = Message(method, parse_absolute_uri(f"https://{host}{target}"), lines)
    components = _components(vector["covered_components"])
    params = [(name, value) for name, value in vector["signature_params"]]
    params_value = serialize_params_value(components, params)
    base = signature_base(message, components, params_value)
    assert base.decode() == vector["signature_base"]
    assert hashlib.sha256(base).hexdigest() == vector.get(
        "signature_base_sha256_hex", hashlib.sha256(base).hexdigest()
    )
    assert b64_encode(key.sign(base)) == vector["expected_signature_b64"]
    assert f"{vector['label']}={params_value}" == vector["headers"]["Signature-Input"]


def test_rfc8037_a3_and_rfc7638_thumbprints() -> None:
    for vector in load_vector("rfc8037_thumbprint.json")["vectors"]:
        assert jwk_thumbprint(vector["jwk_public"]) == vector["thumbprint_b64url"]
        if vector["jwk_public"]["kty"] == "OKP":
            key = SigningKey.from_jwk(vector.get("jwk_private") or B26["key"]["jwk_private"])
            assert key.thumbprint == vector["thumbprint_b64url"]


def test_rfc7638_negative_examples_are_not_the_thumbprint() -> None:
    vectors = load_vector("rfc8037_thumbprint.json")
    raw = bytes.fromhex(B26["key"]["raw_public_hex"])
    good = thumbprint_of_raw(raw)
    for negative in vectors["negative_examples"]:
        assert negative["result"] != good


@pytest.mark.parametrize(
    "vector", load_vector("rfc9530_content_digest.json")["vectors"], ids=lambda v: v["id"]
)
def test_rfc9530_content_digest_examples(vector: dict[str, str]) -> None:
    body = bytes.fromhex(vector["body_hex"])
    if vector["algorithm"] == "sha-256":
        assert content_digest(body) == vector["field_value"]
    parsed = parse_content_digest(vector["field_value"])
    assert b64_encode(parsed[vector["algorithm"]]) == vector["digest_b64"]


def test_rfc9530_b2_empty_body_has_a_digest() -> None:
    assert content_digest(b"") == "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:"
    verify_content_digest(content_digest(b""), b"")


def test_rfc9421_2_1_component_examples() -> None:
    examples = load_vector("rfc9421_component_examples.json")
    section = examples["http_fields_2_1"]
    message = Message(
        "GET", parse_absolute_uri("https://www.example.com/"), Fields(map(tuple, section["input_fields"]))
    )
    for line in section["base_lines"]:
        name = line.split('"')[1]
        assert f'"{name}": {component_value(message, Component(name))}' == line
    empty = examples["empty_field_2_1"]
    message = Message(
        "GET", parse_absolute_uri("https://x.example/"), Fields(map(tuple, empty["input_fields"]))
    )
    assert f'"x-empty-header": {component_value(message, Component("x-empty-header"))}' == empty["base_line"]
    keyed = examples["dictionary_key_2_1_2"]
    message = Message(
        "GET", parse_absolute_uri("https://x.example/"), Fields(map(tuple, keyed["input_fields"]))
    )
    for line in keyed["base_lines"]:
        key = line.split('key="')[1].split('"')[0]
        assert (
            f'"example-dict";key="{key}": {component_value(message, Component("example-dict", key))}' == line
        )


def test_rfc9421_2_2_derived_components() -> None:
    derived = load_vector("rfc9421_component_examples.json")["derived_2_2"]
    message = Message("POST", parse_absolute_uri("https://www.example.com/path?param=value"), Fields())
    got = {
        f'"{name}": {component_value(message, Component(name))}'
        for name in ("@method", "@target-uri", "@authority", "@request-target", "@path")
    }
    assert got == set(derived["base_lines"])
    query = Message(
        "GET", parse_absolute_uri("https://x.example/path?param=value&foo=bar&baz=bat%2Dman"), Fields()
    )
    assert component_value(query, Component("@query")) == "?param=value&foo=bar&baz=bat%2Dman"
    assert (
        component_value(
            Message("GET", parse_absolute_uri("https://x.example/p"), Fields()), Component("@query")
        )
        == "?"
    )


@pytest.mark.parametrize("case", [("request", "base_lines"), ("encoding_request", "encoding_base_lines")])
def test_rfc9421_2_2_8_query_params(case: tuple[str, str]) -> None:
    """Every base line of RFC 9421 section 2.2.8's two examples, from its request line."""
    vector = load_vector("rfc9421_component_examples.json")["derived_2_2"]["query_param"]
    request, lines = case
    method, target, _version = vector[request].split(" ")
    message = Message(method, parse_absolute_uri(f"https://x.example{target}"), Fields())
    for line in vector[lines]:
        identifier, _, value = line.partition(": ")
        name = identifier.split('name="')[1].removesuffix('"')
        component = Component("@query-param", query_name=name)
        assert component.serialized == identifier
        assert component_value(message, component) == value


def test_rfc9421_2_2_8_a_query_param_absent_or_repeated_has_no_value() -> None:
    message = Message("GET", parse_absolute_uri("https://x.example/p?a=1&b=2&a=3&c"), Fields())
    assert component_value(message, Component("@query-param", query_name="c")) == ""
    assert component_value(message, Component("@query-param", query_name="b")) == "2"
    refused = (("a", "ambiguous-query-param"), ("d", "missing-query-param"), ("", "missing-query-param"))
    for name, reason in refused:
        with pytest.raises(SigningError) as err:
            component_value(message, Component("@query-param", query_name=name))
        assert err.value.reason == reason
    bare = Message("GET", parse_absolute_uri("https://x.example/p"), Fields())
    with pytest.raises(SigningError, match="no parameter 'a'"):
        component_value(bare, Component("@query-param", query_name="a"))


def _derived_message(vector: Mapping[str, Any]) -> Message:
    first = DERIVED["vectors"][0]
    lines = vector.get("request_headers_before_signing", first["request_headers_before_signing"])
    return Message("POST", parse_absolute_uri(first["target_uri"]), Fields(map(tuple, lines)))


@pytest.mark.parametrize("vector", DERIVED["vectors"][:3], ids=lambda v: v["id"])
def test_spec_profile_derived_agent_examples(vector: dict[str, Any]) -> None:
    key = SigningKey.from_jwk(DERIVED["agent_key_jwk"])
    signed = sign_message(_derived_message(vector), key, created=1618884473, expires=1618884773)
    assert signed.base.decode() == vector["signature_base"]
    assert signed.input_member == vector["signature_input_member"]
    assert signed.signature_member == vector["signature_member"]


def test_spec_profile_derived_broker_hop() -> None:
    agent, broker = (
        SigningKey.from_jwk(DERIVED["agent_key_jwk"]),
        SigningKey.from_jwk(DERIVED["broker_key_jwk"]),
    )
    hop = DERIVED["vectors"][3]
    message = _derived_message(DERIVED["vectors"][0])
    attach_signature(message.fields, sign_message(message, agent, created=1618884473, expires=1618884773))
    components = (
        *_components(["@method", "@target-uri", "content-digest", "authorization", "signature-agent"]),
        Component("signature", "agent"),
    )
    message = Message(message.method, message.target, message.fields.copy())
    signed = sign_message(
        message, broker, created=1618884474, expires=1618884774, label="broker", components=components
    )
    assert signed.base.decode() == hop["signature_base"]
    assert signed.signature_member == hop["signature_member"]
    attach_signature(message.fields, signed)
    assert message.fields.combined("Signature-Input") == hop["wire_headers_after_broker"]["Signature-Input"]
    assert message.fields.combined("Signature") == hop["wire_headers_after_broker"]["Signature"]
    # and the whole stack verifies with our verifier at the vector's time
    keys = {k.thumbprint: VerificationKey(k.public) for k in (agent, broker)}
    stack = verify_stack(
        message, b'{"hello": "world"}', lambda e, _i: keys.get(e.keyid or ""), now=1618884500
    )
    assert [s.label for s in stack.signatures] == ["agent", "broker"]


def test_spec_profile_variant_covering_signature_input_member() -> None:
    broker = SigningKey.from_jwk(DERIVED["broker_key_jwk"])
    agent = SigningKey.from_jwk(DERIVED["agent_key_jwk"])
    variant = DERIVED["vectors"][4]
    message = _derived_message(DERIVED["vectors"][0])
    attach_signature(message.fields, sign_message(message, agent, created=1618884473, expires=1618884773))
    components = (
        *_components(["@method", "@target-uri", "content-digest", "authorization", "signature-agent"]),
        Component("signature-input", "agent"),
        Component("signature", "agent"),
    )
    signed = sign_message(
        message, broker, created=1618884474, expires=1618884774, label="broker", components=components
    )
    assert signed.base.decode() == variant["signature_base"]
    assert b64_encode(signed.signature) == variant["expected_signature_b64"]


@pytest.mark.parametrize("vector", WBA["vectors"], ids=lambda v: v["id"])
def test_web_bot_auth_draft_vectors_verify_as_published(vector: dict[str, object]) -> None:
    public = PublicKey.from_pem(WBA["key"]["pem_public_spki"].encode())
    ok = public.verify(
        __import__("base64").b64decode(vector["expected_signature_b64"]),
        str(vector["signature_base"]).encode(),
    )
    assert ok is vector["verifies"]


def test_content_digest_mismatch_is_refused() -> None:
    with pytest.raises(VerificationError) as err:
        verify_content_digest(content_digest(b"a"), b"b")
    assert err.value.reason == "content-digest-mismatch"
