"""Spec "Multi-hop forwarding" rule 2: Signature-Agent stays the agent's and is forwarded unchanged.
An agent may send its directory as a bare URL (what the verifier accepts beside the quoted String);
the relay forwards those bytes as they came, never its own spelling of them: the agent's signature
covers them, and a relay that "repaired" them would break it at the origin."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.signatures import Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from tests.proxy.test_relay import AGENT, Rig, running_relay, send

pytestmark = pytest.mark.integration

BODY = b'{"ver":"1.0"}'


def bare_agent_request(rig: Rig) -> tuple[bytes, str]:
    """A POST signed by the agent with ``Signature-Agent`` its directory's bare URL; that value."""
    now = int(time.time())
    url = rig.origin.url("/x")
    agent = rig.agent_dir.base  # no quotes: the bare form
    fields = Fields(
        [
            ("Content-Type", "application/json"),
            ("Content-Digest", content_digest(BODY)),
            ("Authorization", "Bearer agent-token"),
            ("Signature-Agent", agent),
        ]
    )
    attach_signature(
        fields,
        sign_message(Message("POST", parse_absolute_uri(url), fields), AGENT, created=now, expires=now + 60),
    )
    head = f"POST {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(BODY)}\r\n"
    return (head + "".join(f"{n}: {v}\r\n" for n, v in fields) + "\r\n").encode() + BODY, agent


async def test_a_bare_url_signature_agent_is_forwarded_byte_for_byte(tmp_path: Path) -> None:
    async with running_relay(tmp_path, lambda _origin: {"relay": {"max_hops": 3}}) as rig:
        raw, agent = bare_agent_request(rig)
        status, doc = await send(rig, raw)
        assert status == 200, doc
        arrival = rig.origin.arrivals[-1]
        assert arrival.header("signature-agent") == agent  # not '"' + agent + '"'
        assert arrival.verified, arrival.reason  # both labels, at the origin
        assert arrival.oracle == "ok", arrival.oracle
        assert arrival.labels == ["agent", "broker"]
