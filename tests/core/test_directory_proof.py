"""Possession proofs on a directory response: the draft's vector reproduced and checked, every key
proven, and a tampered body, a foreign authority or an expired proof proving nothing."""

from __future__ import annotations

import base64

from signing_proxy.core.digest import content_digest
from signing_proxy.core.directory_proof import (
    directory_proof_base,
    directory_proof_params,
    proven_keys,
    sign_directory_response,
)
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import PublicKey, SigningKey
from tests.conftest import load_vector

WBA = load_vector("web_bot_auth_drafts_ed25519.json")
VECTOR = next(v for v in WBA["vectors"] if v["id"] == "protocol-02-signed-directory-response")
KEY = SigningKey.from_pem(WBA["key"]["pem_private_pkcs8"].encode())
PUBLIC = PublicKey.from_pem(WBA["key"]["pem_public_spki"].encode())
VECTOR_NOW = 1735689600 + 10


def test_the_drafts_signed_directory_vector_is_reproduced_byte_for_byte() -> None:
    body = str(VECTOR["response_body"]).encode()
    assert content_digest(body) == VECTOR["headers"]["Content-Digest"]
    params = directory_proof_params(KEY.thumbprint, 1735689600, 4889289600)
    assert f"binding={params}" == VECTOR["headers"]["Signature-Input"]
    base = directory_proof_base("signature-agent.test", content_digest(body), params)
    assert base.decode() == VECTOR["signature_base"]
    assert base64.b64encode(KEY.sign(base)).decode() == VECTOR["expected_signature_b64"]


def test_the_drafts_signed_directory_vector_proves_its_key() -> None:
    body = str(VECTOR["response_body"]).encode()
    fields = Fields(tuple(VECTOR["headers"].items()))
    assert proven_keys(body, "signature-agent.test", fields, [PUBLIC], now=VECTOR_NOW) == {PUBLIC.thumbprint}


def _signed(keys: list[SigningKey], body: bytes = b'{"keys":[]}') -> Fields:
    return Fields(sign_directory_response(body, "dir.example", keys, created=1000, expires=2000))


def test_every_key_is_proven_and_an_unproven_key_is_not() -> None:
    keys = [SigningKey.generate(), SigningKey.generate()]
    stranger = SigningKey.generate()
    fields = _signed(keys)
    publics = [k.public for k in (*keys, stranger)]
    assert proven_keys(b'{"keys":[]}', "dir.example", fields, publics, now=1500) == {
        k.thumbprint for k in keys
    }


def test_a_tampered_body_proves_nothing() -> None:
    keys = [SigningKey.generate()]
    fields = _signed(keys)
    assert proven_keys(b'{"keys":[{}]}', "dir.example", fields, [keys[0].public], now=1500) == frozenset()
    fields.set("Content-Digest", content_digest(b'{"keys":[{}]}'))  # a digest recomputed for the new body
    assert proven_keys(b'{"keys":[{}]}', "dir.example", fields, [keys[0].public], now=1500) == frozenset()


def test_another_authority_or_time_outside_the_window_proves_nothing() -> None:
    key = SigningKey.generate()
    fields = _signed([key])
    assert proven_keys(b'{"keys":[]}', "evil.example", fields, [key.public], now=1500) == frozenset()
    assert proven_keys(b'{"keys":[]}', "dir.example", fields, [key.public], now=2000) == frozenset()
    assert proven_keys(b'{"keys":[]}', "dir.example", fields, [key.public], now=900) == frozenset()
    assert proven_keys(b'{"keys":[]}', "dir.example", fields, [key.public], now=1000) == {key.thumbprint}


def test_a_response_without_directory_proofs_is_not_judged() -> None:
    key = SigningKey.generate()
    assert proven_keys(b"{}", "dir.example", Fields(()), [key.public], now=1500) is None
    other = Fields(
        (("Signature-Input", 'sig=("@authority");tag="web-bot-auth"'), ("Signature", "sig=:AA==:"))
    )
    assert proven_keys(b"{}", "dir.example", other, [key.public], now=1500) is None
