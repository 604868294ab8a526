"""What a web-bot-auth relay refuses of a stranger's stack before it adds its label, whether or not it
verifies: a Signature-Agent of more than ``MAX_AGENT_MEMBERS`` members (401, before any parse), a
stack mixing profiles in any label (403 ``profile-mix``, before any key is fetched), and a covered
Signature-Agent member whose field ``Connection`` names (400 ``covered-field-not-forwarded``), and
under the spec's profile too, any field a label covers that ``Connection`` names.
In-process, no network: keys are pinned."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core import profiles
from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.core.profiles import WEB_BOT_AUTH, profile_params
from signing_proxy.core.signatures import Component, Message, attach_signature, hop_components, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.errors import ProxyError
from signing_proxy.net.framing import Outgoing
from signing_proxy.proxy.pipeline import Signer
from signing_proxy.proxy.relay import RelayPipeline

AGENT = SigningKey.generate()
BROKER = SigningKey.generate()
RELAY = SigningKey.generate()
TARGET = parse_absolute_uri("https://example.com/")
AGENT_COVERS = (Component("@authority"), Component("signature-agent", key="agent"))
AGENT_MEMBER = 'agent="https://agent.example/agents/a"'


def _relay(tmp_path: Path, *, verify: bool) -> RelayPipeline:
    pins = []
    for name, key in (("agent", AGENT), ("broker", BROKER)):
        path = tmp_path / f"{name}.jwk"
        path.write_text(json.dumps(key.public.jwk()))
        pins.append(str(path))
    config = parse_config(
        {
            "mode": "relay",
            "relay": {"verify": verify, "pinned_agent_keys": pins[:1], "pinned_broker_keys": pins[1:]},
            "profiles": {"default": "web-bot-auth"},
            "signing": {"signature_agent": "https://relay.example", "label": "relay"},
        }
    )
    return RelayPipeline(config, Signer(StaticKeyProvider(RELAY), label="relay", validity_s=300))


def _through(relay: RelayPipeline, lines: list[tuple[str, str]]) -> Outgoing:
    async def go() -> Outgoing:
        try:
            return await relay.prepare("GET", TARGET, lines, b"", framed=False)
        finally:
            await relay.close()

    return asyncio.run(go())


def _refused(relay: RelayPipeline, lines: list[tuple[str, str]]) -> tuple[int, str]:
    with pytest.raises(ProxyError) as refused:
        _through(relay, lines)
    return refused.value.status, refused.value.reason


def _agent_signed(agent_field: str, *extra: tuple[str, str]) -> list[tuple[str, str]]:
    """A web-bot-auth agent label covering its own member ``agent`` of ``agent_field``."""
    now = int(time.time())
    message = Message("GET", TARGET, Fields((("Host", "example.com"), ("Signature-Agent", agent_field))))
    signed = sign_message(
        message,
        AGENT,
        created=now,
        expires=now + 300,
        label="agent",
        components=AGENT_COVERS,
        extra_params=profile_params(WEB_BOT_AUTH, os.urandom(64)),
    )
    attach_signature(message.fields, signed)
    return [*message.fields, *extra]


def _members(count: int) -> str:
    """The agent's member, then ``relay``, ``relay2``, ``relay3``… (uncovered: anyone may add them).
    The agent's member names no directory (a path): its key is the pinned one."""
    names = ["relay", *(f"relay{i}" for i in range(2, count))]
    return ", ".join([AGENT_MEMBER, *(f"{name}=1" for name in names)])


def _relay_label(out: Outgoing) -> str:
    line = next(x for x in out.head.decode("latin-1").split("\r\n") if x.startswith("Signature-Input:"))
    return line.rsplit(", ", 1)[1].split("=", 1)[0]


@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no-verify"])
def test_a_signature_agent_of_the_bound_gets_a_label_of_its_own(tmp_path: Path, verify: bool) -> None:
    out = _through(_relay(tmp_path, verify=verify), _agent_signed(_members(profiles.MAX_AGENT_MEMBERS)))
    assert _relay_label(out) == f"relay{profiles.MAX_AGENT_MEMBERS}"  # past relay, relay2 .. relay63


@pytest.mark.parametrize("count", [65, 5_000])  # MAX_AGENT_MEMBERS + 1, and the review's head
@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no-verify"])
def test_a_signature_agent_past_the_bound_is_refused(tmp_path: Path, verify: bool, count: int) -> None:
    """5,000 members relayN=1 (59 KB, under the head limit) held the event loop 0.2-0.4 s a request:
    parsed four or five times, and our label searched among them all (quadratic)."""
    lines = _agent_signed(_members(count))
    assert _refused(_relay(tmp_path, verify=verify), lines) == (401, "too-many-agent-members")


def _web_then_svc() -> list[tuple[str, str]]:
    """A web-bot-auth agent label, then a broker's label under the spec's profile."""
    now = int(time.time())
    message = Message(
        "GET",
        TARGET,
        Fields(
            (
                ("Host", "example.com"),
                ("Content-Digest", content_digest(b"")),
                ("Authorization", ""),
                ("Signature-Agent", ""),
            )
        ),
    )
    web = sign_message(
        message,
        AGENT,
        created=now,
        expires=now + 300,
        label="agent",
        components=(Component("@authority"),),
        extra_params=profile_params(WEB_BOT_AUTH, os.urandom(64)),
    )
    attach_signature(message.fields, web)
    svc = sign_message(
        message, BROKER, created=now, expires=now + 300, label="b", components=hop_components("agent")
    )
    attach_signature(message.fields, svc)
    return list(message.fields)


@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no-verify"])
def test_a_stack_mixing_profiles_in_a_later_label_is_refused_profile_mix(
    tmp_path: Path, verify: bool
) -> None:
    """Only the first label's profile was compared: unverified, our label went on a stack no verifier
    accepts; verified, the verifier's 401 answered it, not README's 403."""
    assert _refused(_relay(tmp_path, verify=verify), _web_then_svc()) == (403, "profile-mix")


def test_a_covered_signature_agent_named_in_connection_is_refused_as_not_forwarded(tmp_path: Path) -> None:
    """The relay drops it with the field Connection names; it then failed to sign (400
    missing-dictionary-member, counted as a signing failure) instead of saying why."""
    lines = _agent_signed(AGENT_MEMBER, ("Connection", "Signature-Agent"))
    with pytest.raises(ProxyError) as refused:
        _through(_relay(tmp_path, verify=False), lines)
    assert (refused.value.status, refused.value.reason) == (400, "covered-field-not-forwarded")
    assert "'signature-agent'" in refused.value.detail


def _svc_relay(tmp_path: Path, *, verify: bool) -> RelayPipeline:
    """A relay under the spec's profile (the default), the agent's key pinned."""
    path = tmp_path / "agent.jwk"
    path.write_text(json.dumps(AGENT.public.jwk()))
    config = parse_config(
        {
            "mode": "relay",
            "relay": {"verify": verify, "pinned_agent_keys": [str(path)]},
            "signing": {"label": "relay"},
        }
    )
    return RelayPipeline(config, Signer(StaticKeyProvider(RELAY), label="relay", validity_s=300))


def _svc_agent_signed(*extra: tuple[str, str]) -> list[tuple[str, str]]:
    """An agent's label under the spec's profile (its five components), with ``extra`` after it."""
    now = int(time.time())
    fields = Fields(
        (
            ("Host", "example.com"),
            ("Content-Digest", content_digest(b"")),
            ("Authorization", "Bearer t"),
            ("Signature-Agent", ""),
        )
    )
    message = Message("GET", TARGET, fields)
    attach_signature(fields, sign_message(message, AGENT, created=now, expires=now + 300, label="agent"))
    return [*fields, *extra]


@pytest.mark.parametrize("named", ["Signature-Agent", "Authorization", "content-digest"])
@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no-verify"])
def test_a_spec_relay_refuses_a_covered_field_connection_names(
    tmp_path: Path, verify: bool, named: str
) -> None:
    """Under the spec's profile the relay dropped the field and signed: the stack failed only at the
    next verifier (unverified), or was refused as a bad signature rather than for what it was."""
    status, reason = _refused(_svc_relay(tmp_path, verify=verify), _svc_agent_signed(("Connection", named)))
    assert (status, reason) == (400, "covered-field-not-forwarded")


def test_a_spec_relay_forwards_when_connection_names_an_uncovered_field(tmp_path: Path) -> None:
    out = _through(
        _svc_relay(tmp_path, verify=True), _svc_agent_signed(("Connection", "x-hop"), ("X-Hop", "1"))
    )
    head = out.head.decode("latin-1")
    assert "\r\nX-Hop:" not in head
    assert _relay_label(out) == "relay"
