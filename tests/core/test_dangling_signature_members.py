"""Signature-Input and Signature name the same labels (RFC 9421 section 4): a member of either with
no member of the same label in the other is refused (``dangling-label``), in both directions. A
Signature member nobody declared is not a harmless extra: it is bytes beside the stack that no
verifier checked."""

from __future__ import annotations

import base64

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
GHOST_SIGNATURE = "ghost=:" + base64.b64encode(bytes(64)).decode() + ":"
GHOST_INPUT = f'ghost=("@method");keyid="{AGENT.thumbprint}";alg="ed25519";created={NOW};expires={NOW + 60}'


def signed() -> Message:
    fields = Fields(
        [("Content-Digest", content_digest(BODY)), ("Authorization", ""), ("Signature-Agent", "")]
    )
    message = Message("POST", parse_absolute_uri(URL), fields)
    attach_signature(fields, sign_message(message, AGENT, created=NOW, expires=NOW + 60))
    return message


def verify(message: Message) -> VerifiedStack:
    known = VerificationKey(AGENT.public)
    return verify_stack(
        message, BODY, lambda entry, _i: known if entry.keyid == AGENT.thumbprint else None, now=NOW
    )


@pytest.mark.parametrize(
    ("header", "extra"),
    [("Signature", GHOST_SIGNATURE), ("Signature-Input", GHOST_INPUT)],
    ids=["signature-without-input", "input-without-signature"],
)
def test_a_member_in_only_one_of_the_two_headers_is_refused(header: str, extra: str) -> None:
    message = signed()
    assert verify(message).hops == 1  # the control: the agent's own stack verifies
    message.fields.add(header, extra)  # a second line: the same Dictionary, one more member
    with pytest.raises(VerificationError) as caught:
        verify(message)
    assert caught.value.reason == "dangling-label"
    assert "ghost" in caught.value.detail
