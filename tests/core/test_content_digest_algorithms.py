"""Content-Digest of a signed request (spec "Request signature": the form ``sha-256=:<base64>:``):
a digest without a ``sha-256`` member is refused even when its other member matches the body, and
every active member present is checked, a wrong ``sha-512`` beside a right ``sha-256`` too. Each
request is signed over the Content-Digest it carries, so the digest rule is the only one broken."""

from __future__ import annotations

import base64
import hashlib

import pytest

from signing_proxy.core.digest import content_digest
from signing_proxy.core.errors import VerificationError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.signatures import (
    Message,
    VerificationKey,
    VerifiedStack,
    attach_signature,
    sign_message,
    verify_stack,
)
from signing_proxy.core.uri import parse_absolute_uri

NOW = 1_700_000_000
URL = "https://exchange.example/svc.v1.ExchangeService/DiscoverResources"
BODY = b'{"ver":"1.0"}'
AGENT = SigningKey.from_seed(bytes(range(32)))
SHA512 = "sha-512=:" + base64.b64encode(hashlib.sha512(BODY).digest()).decode() + ":"
WRONG_SHA512 = "sha-512=:" + base64.b64encode(hashlib.sha512(b"other").digest()).decode() + ":"


def verify(digest: str) -> VerifiedStack:
    """Verify a request for BODY signed by AGENT with ``Content-Digest: digest``."""
    fields = Fields([("Content-Digest", digest), ("Authorization", ""), ("Signature-Agent", "")])
    message = Message("POST", parse_absolute_uri(URL), fields)
    attach_signature(fields, sign_message(message, AGENT, created=NOW, expires=NOW + 60))
    known = VerificationKey(AGENT.public)
    return verify_stack(
        message, BODY, lambda entry, _i: known if entry.keyid == AGENT.thumbprint else None, now=NOW
    )


def test_both_right_members_pass() -> None:
    assert verify(f"{content_digest(BODY)}, {SHA512}").hops == 1


def test_a_digest_without_sha256_is_refused_though_its_sha512_matches() -> None:
    with pytest.raises(VerificationError) as caught:
        verify(SHA512)
    assert caught.value.reason == "content-digest-unsupported"


def test_a_wrong_sha512_beside_a_right_sha256_is_refused() -> None:
    with pytest.raises(VerificationError) as caught:
        verify(f"{content_digest(BODY)}, {WRONG_SHA512}")
    assert caught.value.reason == "content-digest-mismatch"
    assert "sha-512" in caught.value.detail
