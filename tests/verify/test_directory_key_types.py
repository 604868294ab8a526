"""A drafts' directory that publishes keys of other types beside Ed25519 (protocol-02 names RSA and
EC keyids): those keys are ignored (RFC 7517 section 5), the Ed25519 key verifies."""

from __future__ import annotations

import json
import time

from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.profiles import (
    WEB_BOT_AUTH,
    profile_components,
    profile_params,
    signature_agent_field,
)
from signing_proxy.core.signatures import Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.verify import DirectoryResolver, FetchResult, RequestVerifier, directory_url
from tests.verify.fakes import FakeFetch

AGENT = SigningKey.generate()
AGENT_DIR = "https://agent.example"
URL = "https://shop.example/cart?x=1"


def _request() -> Fields:
    """A web-bot-auth request signed by AGENT, its covered Signature-Agent member naming AGENT_DIR."""
    now = int(time.time())
    fields = Fields(())
    value, agent = signature_agent_field(WEB_BOT_AUTH, "agent", AGENT_DIR)
    assert value is not None
    fields.add("Signature-Agent", value)
    member = sign_message(
        Message("GET", parse_absolute_uri(URL), fields),
        AGENT,
        created=now,
        expires=now + 300,
        components=profile_components(WEB_BOT_AUTH, previous=None, agent=agent),
        extra_params=profile_params(WEB_BOT_AUTH, bytes(64)),
    )
    attach_signature(fields, member)
    return fields


async def test_an_agent_publishing_ed25519_beside_p256_verifies_with_its_ed25519_key() -> None:
    """The drafts' directory of an agent with a P-256 key too: the P-256 key is ignored (RFC 7517
    section 5), not the whole directory refused (no key of the agent could verify)."""
    p256 = {
        "kty": "EC",
        "crv": "P-256",
        "x": "qIVYZVLCrPZHGHjP17CTW0_-D9Lfw0EkjqF7xB4FivA",
        "y": "Mc4nN9LTDOBhfoUeg8Ye9WedFRhnZXZJA12Qp0zZ6F0",
        "use": "sig",
    }
    ed25519 = {**AGENT.public.jwk(), "kid": AGENT.thumbprint, "use": "sig"}
    body = json.dumps({"keys": [p256, ed25519]}).encode()
    fetch = FakeFetch()
    fetch.answers[directory_url(AGENT_DIR)] = FetchResult(200, body, "max-age=300")
    verifier = RequestVerifier(DirectoryResolver(fetch))
    stack = await verifier.verify("GET", URL, _request(), b"")
    assert (stack.profile, stack.agent.key_source) == ("web-bot-auth", AGENT_DIR)
    await verifier.close()
