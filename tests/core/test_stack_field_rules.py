"""Two rules on the fields of a spec-profile stack that no test guarded (each survived a mutation).

``Content-Digest`` must carry ``sha-256``, and every member it carries is checked: a ``sha-512``
that matches is no substitute, and a wrong one beside a right ``sha-256`` is refused.

Signature-Input and Signature name the same labels (RFC 9421 section 4): a member of either with
no member of the same label in the other is refused (``dangling-label``), in both directions. A
Signature member nobody declared is not a harmless extra: it is bytes beside the stack that no
verifier checked.
"""

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
GHOST_SIGNATURE = "ghost=:" + base64.b64encode(bytes(64)).decode() + ":"
GHOST_INPUT = f'ghost=("@method");keyid="{AGENT.thumbprint}";alg="ed25519";created={NOW};expires={NOW + 60}'


def signed(digest: str = content_digest(BODY)) -> Message:
    """A request for BODY with ``Content-Digest: digest``, signed by AGENT."""
    fields = Fields([("Content-Digest", digest), ("Authorization", ""), ("Signature-Agent", "")])
    message = Message("POST", parse_absolute_uri(URL), fields)
    attach_signature(fields, sign_message(message, AGENT, created=NOW, expires=NOW + 60))
    return message


def verify(message: Message) -> VerifiedStack:
    known = VerificationKey(AGENT.public)
    return verify_stack(
        message, BODY, lambda entry, _i: known if entry.keyid == AGENT.thumbprint else None, now=NOW
    )


def refusal(message: Message) -> VerificationError:
    with pytest.raises(VerificationError) as caught:
        verify(message)
    return caught.value


# --- Content-Digest ----------------------------------------------------------------------------------


def test_both_right_members_pass() -> None:
    assert verify(signed(f"{content_digest(BODY)}, {SHA512}")).hops == 1


def test_a_digest_without_sha256_is_refused_though_its_sha512_matches() -> None:
    assert refusal(signed(SHA512)).reason == "content-digest-unsupported"


def test_a_wrong_sha512_beside_a_right_sha256_is_refused() -> None:
    refused = refusal(signed(f"{content_digest(BODY)}, {WRONG_SHA512}"))
    assert refused.reason == "content-digest-mismatch"
    assert "sha-512" in refused.detail


# --- dangling labels ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "extra"),
    [("Signature", GHOST_SIGNATURE), ("Signature-Input", GHOST_INPUT)],
    ids=["signature-without-input", "input-without-signature"],
)
def test_a_member_in_only_one_of_the_two_headers_is_refused(header: str, extra: str) -> None:
    message = signed()
    assert verify(message).hops == 1  # the control: the agent's own stack verifies
    message.fields.add(header, extra)  # a second line: the same Dictionary, one more member
    refused = refusal(message)
    assert refused.reason == "dangling-label"
    assert "ghost" in refused.detail
