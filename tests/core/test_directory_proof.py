"""Possession proofs on a directory response: the draft's vector reproduced and checked, every key
proven, and a tampered body, a foreign authority or an expired proof proving nothing."""

from __future__ import annotations

import base64

import pytest

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
    assert proven_keys(body, "signature-agent.test", fields, [PUBLIC], now=VECTOR_NOW) == frozenset(
        {PUBLIC.thumbprint}
    )


def _signed(keys: list[SigningKey], body: bytes = b'{"keys":[]}') -> Fields:
    return Fields(sign_directory_response(body, "dir.example", keys, created=1000, expires=2000))


def test_every_key_is_proven_and_an_unproven_key_is_not() -> None:
    keys = [SigningKey.generate(), SigningKey.generate()]
    stranger = SigningKey.generate()
    fields = _signed(keys)
    publics = [k.public for k in (*keys, stranger)]
    assert proven_keys(b'{"keys":[]}', "dir.example", fields, publics, now=1500) == frozenset(
        k.thumbprint for k in keys
    )


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
    assert proven_keys(b'{"keys":[]}', "dir.example", fields, [key.public], now=1000) == frozenset(
        {key.thumbprint}
    )


def test_a_directory_with_no_key_to_prove_carries_no_empty_signature_fields() -> None:
    """An agent's directory served without its private keys has nothing to prove: it went out with
    empty ``Signature-Input:`` and ``Signature:`` lines (RFC 8941 section 4.1: an empty Dictionary
    is not serialized at all)."""
    body = b'{"keys":[]}'
    fields = sign_directory_response(body, "agent.example", [], created=VECTOR_NOW, expires=VECTOR_NOW + 60)
    assert fields == [("Content-Digest", content_digest(body))]


def test_a_response_without_directory_proofs_is_not_judged() -> None:
    key = SigningKey.generate()
    assert proven_keys(b"{}", "dir.example", Fields(()), [key.public], now=1500) is None
    other = Fields(
        (("Signature-Input", 'sig=("@authority");tag="web-bot-auth"'), ("Signature", "sig=:AA==:"))
    )
    assert proven_keys(b"{}", "dir.example", other, [key.public], now=1500) is None


def _proof(key: SigningKey, params: str, body: bytes = b'{"keys":[]}') -> Fields:
    """A proof of ``key`` with ``params`` as its Signature-Input member, signed correctly over it."""
    digest = content_digest(body)
    signature = base64.b64encode(key.sign(directory_proof_base("dir.example", digest, params))).decode()
    member = f"binding=:{signature}:"
    return Fields(
        [("Content-Digest", digest), ("Signature-Input", f"binding={params}"), ("Signature", member)]
    )


PROOF_KEY = SigningKey.from_seed(bytes(range(32)))
PROVEN = frozenset({PROOF_KEY.thumbprint})
TAG = ';tag="http-message-signatures-directory"'
WINDOW = f';created=1000;expires=2000;keyid="{PROOF_KEY.thumbprint}"'
COVERED = '("@authority";req "content-digest")'


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (f"{COVERED}{WINDOW}{TAG}", PROVEN),
        (f'{COVERED}{WINDOW};alg="ed25519"{TAG}', PROVEN),
        (f'("@authority" "content-digest"){WINDOW}{TAG}', frozenset()),  # @authority without ;req
        (f'("@authority";req "content-digest" "@method"){WINDOW}{TAG}', frozenset()),  # one more
        (f'("@authority";req){WINDOW}{TAG}', frozenset()),  # the body not covered
        (f'{COVERED}{WINDOW}{TAG};foo="x"', frozenset()),  # an unknown parameter
        (f'{COVERED}{WINDOW};alg="rsa-pss-sha512"{TAG}', frozenset()),
        (f'{COVERED};created="1000";expires=2000;keyid="{PROOF_KEY.thumbprint}"{TAG}', frozenset()),
        (f"{COVERED}{WINDOW}", None),  # no directory tag: not a directory proof, nothing judged
        (f'{COVERED}{WINDOW};tag="web-bot-auth"', None),
        # the tag as a Token, not a String (RFC 9421 section 2.3): judged as a proof, and not one
        (f"{COVERED}{WINDOW};tag=http-message-signatures-directory", frozenset()),
        (f"{COVERED}{WINDOW};alg=ed25519{TAG}", frozenset()),  # alg as a Token: a String it must be
    ],
)
def test_a_correctly_signed_proof_of_the_wrong_shape_proves_nothing(
    params: str, expected: frozenset[str] | None
) -> None:
    fields = _proof(PROOF_KEY, params)
    assert proven_keys(b'{"keys":[]}', "dir.example", fields, [PROOF_KEY.public], now=1500) == expected


# A stranger's directory response is bounded work (drafts: "Verifiers SHOULD enforce a maximum key
# count", "Each key SHOULD be used to provide one signature"): counted, not timed.


@pytest.fixture
def verifications(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The thumbprint of the key behind every signature verification, in order."""
    calls: list[str] = []
    real = PublicKey.verify

    def counting(self: PublicKey, signature: bytes, data: bytes) -> bool:
        calls.append(self.thumbprint)
        return real(self, signature, data)

    monkeypatch.setattr(PublicKey, "verify", counting)
    return calls


def _proofs(proofs: list[tuple[SigningKey, bool]], body: bytes = b'{"keys":[]}') -> Fields:
    """One member per ``(key, valid)``: a proof of ``key``, correctly signed or with a bad signature."""
    digest = content_digest(body)
    inputs, signatures = [], []
    for i, (key, valid) in enumerate(proofs):
        params = directory_proof_params(key.thumbprint, 1000, 2000)
        signature = key.sign(directory_proof_base("dir.example", digest, params)) if valid else bytes(64)
        inputs.append(f"b{i}={params}")
        signatures.append(f"b{i}=:{base64.b64encode(signature).decode()}:")
    return Fields(
        [
            ("Content-Digest", digest),
            ("Signature-Input", ", ".join(inputs)),
            ("Signature", ", ".join(signatures)),
        ]
    )


@pytest.mark.parametrize("count", [2, 60, 64, 245])  # 245: the reviewer's 63 KB head
def test_many_proofs_of_one_listed_key_cost_at_most_one_verification(
    verifications: list[str], count: int
) -> None:
    fields = _proofs([(PROOF_KEY, False)] * count)
    proven = proven_keys(b'{"keys":[]}', "dir.example", fields, [PROOF_KEY.public], now=1500)
    assert proven == frozenset()
    assert len(verifications) <= 1


def test_each_listed_key_is_tried_once_and_its_first_proof_decides(verifications: list[str]) -> None:
    """A legitimate directory (one proof per key) is proven as before; repeats are never verified."""
    a, b, stranger = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    fields = _proofs([(a, True), *[(a, False)] * 20, (stranger, True), (b, True), *[(b, False)] * 20])
    publics = [a.public, b.public]
    assert proven_keys(b'{"keys":[]}', "dir.example", fields, publics, now=1500) == frozenset(
        {a.thumbprint, b.thumbprint}
    )
    assert verifications == [a.thumbprint, b.thumbprint]
    verifications.clear()
    fields = _proofs([(a, False), (a, True)])  # "each key SHOULD be used to provide one signature"
    assert proven_keys(b'{"keys":[]}', "dir.example", fields, [a.public], now=1500) == frozenset()
    assert verifications == [a.thumbprint]


def test_more_members_than_the_key_bound_prove_nothing(verifications: list[str]) -> None:
    keys = [SigningKey.generate() for _ in range(3)]
    fields = _signed(keys)
    publics = [k.public for k in keys]
    every = frozenset(k.thumbprint for k in keys)
    assert proven_keys(b'{"keys":[]}', "dir.example", fields, publics, now=1500, max_proofs=3) == every
    assert proven_keys(b'{"keys":[]}', "dir.example", fields, publics, now=1500, max_proofs=2) == frozenset()
    assert len(verifications) == 3
    verifications.clear()
    digest = content_digest(b'{"keys":[]}') + ", x0=:AA==:, x1=:AA==:, x2=:AA==:"  # unknown: ignored
    params = directory_proof_params(PROOF_KEY.thumbprint, 1000, 2000)
    signature = base64.b64encode(PROOF_KEY.sign(directory_proof_base("dir.example", digest, params))).decode()
    fields = Fields(
        [("Content-Digest", digest), ("Signature-Input", f"b={params}"), ("Signature", f"b=:{signature}:")]
    )
    assert (
        proven_keys(b'{"keys":[]}', "dir.example", fields, [PROOF_KEY.public], now=1500, max_proofs=4)
        == PROVEN
    )
    assert (
        proven_keys(b'{"keys":[]}', "dir.example", fields, [PROOF_KEY.public], now=1500, max_proofs=3)
        == frozenset()
    )
    assert len(verifications) == 1
