"""A web-bot-auth Signature-Agent member that is http, not https, names no key directory (protocol-02
5.5: values "MUST be https URIs", a verifier "MUST ignore a member carrying anything else"): the
label is verified by a pinned agent key, and nothing is fetched (in-process, no network)."""

from __future__ import annotations

import asyncio
import os
import time

from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.profiles import WEB_BOT_AUTH, profile_params
from signing_proxy.core.signatures import Component, Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.verify.build import build_verifier
from signing_proxy.verify.verifier import VerifierPolicy

URL = "https://example.com/"
COVERED = (Component("@authority"), Component("signature-agent", key="agent"))


def test_an_http_member_falls_back_to_the_pinned_key() -> None:
    """It was taken for a directory and refused (``signature-agent-refused``, egress-scheme): with
    ``egress.allow_private`` it would have been fetched over plain http."""
    key = SigningKey.generate()
    now = int(time.time())
    message = Message(
        "GET", parse_absolute_uri(URL), Fields((("Signature-Agent", 'agent="http://agent.example"'),))
    )
    signed = sign_message(
        message,
        key,
        created=now,
        expires=now + 300,
        label="agent",
        components=COVERED,
        extra_params=profile_params(WEB_BOT_AUTH, os.urandom(64)),
    )
    attach_signature(message.fields, signed)

    async def verify() -> tuple[str | None, str | None]:
        verifier = build_verifier(VerifierPolicy(pinned_agent_keys=(key.public,)))
        try:
            stack = await verifier.verify("GET", URL, message.fields, b"")
        finally:
            await verifier.close()
        return stack.agent.key_source, stack.directory

    assert asyncio.run(verify()) == ("pinned", None)
