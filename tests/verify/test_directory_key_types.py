"""A drafts' directory that publishes keys of other types beside Ed25519 (protocol-02 names RSA and
EC keyids): those keys are ignored (RFC 7517 section 5), the Ed25519 key verifies."""

from __future__ import annotations

import json

from signing_proxy.core.jwk import SigningKey
from signing_proxy.verify import DirectoryResolver, FetchResult, RequestVerifier, directory_url
from tests.verify.fakes import FakeFetch
from tests.verify.test_web_profile_verifier import AGENT_DIR, URL
from tests.verify.test_web_profile_verifier import _request as web_signed

AGENT = SigningKey.generate()


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
    stack = await verifier.verify("GET", URL, web_signed(AGENT), b"")
    assert (stack.profile, stack.agent.key_source) == ("web-bot-auth", AGENT_DIR)
    await verifier.close()
