"""Gateway mode accepts an agent with an empty ``Signature-Agent`` (spec: "the normal shape for an
agent with ... no key directory"; DESIGN 5: its key then comes from pinned keys in configuration):
``gateway.pinned_agent_keys`` and ``gateway.pinned_broker_keys`` are public key files read as the
relay reads its own (``load_pinned_keys``), handed to the verifier's policy. Through
``build_gateway_verifier``, the embedding path; no fetch is needed, none is made."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from signing_proxy.config import ConfigError, parse_config
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import PublicKey, SigningKey
from signing_proxy.core.signatures import Message, attach_signature, hop_components, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.verify import VerifierPolicy, gateway_build
from signing_proxy.verify.gateway import GatewayRefusal, GatewayVerifier
from signing_proxy.verify.gateway_build import build_gateway_verifier
from tests.verify.fakes import NOW
from tests.verify.strangers import signed

URL = "https://exchange.example/feed"
BODY = b'{"q": 1}'
AGENT, BROKER = SigningKey.generate(), SigningKey.generate()


def load_pinned_keys(paths: Sequence[str], where: str) -> tuple[PublicKey, ...]:
    """``gateway_build.load_pinned_keys``, looked up when called."""
    keys: tuple[PublicKey, ...] = gateway_build.load_pinned_keys(paths, where)
    return keys


def pin(tmp_path: Path, key: SigningKey, name: str) -> str:
    path = tmp_path / f"{name}.pub.jwk"
    path.write_text(json.dumps(key.public.jwk()))
    return str(path)


def gateway_config(tmp_path: Path) -> dict[str, object]:
    return {
        "mode": "gateway",
        "gateway": {
            "upstream": "http://127.0.0.1:9000",
            "pinned_agent_keys": [pin(tmp_path, AGENT, "agent")],
            "pinned_broker_keys": [pin(tmp_path, BROKER, "broker")],
        },
    }


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[GatewayVerifier]:
    section = parse_config(gateway_config(tmp_path)).gateway
    policy = VerifierPolicy(
        pinned_agent_keys=load_pinned_keys(section.pinned_agent_keys, "gateway.pinned_agent_keys"),
        pinned_broker_keys=load_pinned_keys(section.pinned_broker_keys, "gateway.pinned_broker_keys"),
    )
    made = build_gateway_verifier(policy, clock=lambda: float(NOW))
    yield made
    await made.close()


def test_the_gateway_section_takes_pinned_key_files(tmp_path: Path) -> None:
    section = parse_config(gateway_config(tmp_path)).gateway
    assert section.pinned_agent_keys == (str(tmp_path / "agent.pub.jwk"),)
    assert section.pinned_broker_keys == (str(tmp_path / "broker.pub.jwk"),)
    assert load_pinned_keys(section.pinned_agent_keys, "gateway.pinned_agent_keys") == (AGENT.public,)
    default = parse_config({"mode": "gateway", "gateway": {"upstream": "http://127.0.0.1:9000"}}).gateway
    assert (default.pinned_agent_keys, default.pinned_broker_keys) == ((), ())


def test_an_unusable_pinned_key_file_is_refused_naming_its_key(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere.jwk")
    with pytest.raises(ConfigError) as caught:
        load_pinned_keys([missing], "gateway.pinned_agent_keys")
    assert caught.value.reason == "pinned-key-unusable"
    assert str(caught.value).startswith("gateway.pinned_agent_keys: ")


async def test_an_agent_with_an_empty_signature_agent_is_verified_by_its_pinned_key(
    gateway: GatewayVerifier,
) -> None:
    verdict = await gateway.check("POST", URL, signed("", AGENT, now=NOW, url=URL, body=BODY), BODY)
    assert verdict.stack.agent.keyid == AGENT.thumbprint
    assert dict(verdict.headers())["X-Verified-Directory"] == "pinned"
    with pytest.raises(GatewayRefusal) as caught:  # a key nobody pinned: still refused
        await gateway.check("POST", URL, signed("", SigningKey.generate(), now=NOW, url=URL, body=BODY), BODY)
    assert (caught.value.status, caught.value.reason) == (401, "unknown-keyid")


async def test_a_broker_known_by_its_pinned_key_adds_a_label(gateway: GatewayVerifier) -> None:
    fields: Fields = signed("", AGENT, now=NOW, url=URL, body=BODY)
    hop = sign_message(
        Message("POST", parse_absolute_uri(URL), fields),
        BROKER,
        created=NOW,
        expires=NOW + 60,
        label="broker",
        components=hop_components("agent"),
    )
    attach_signature(fields, hop)
    verdict = await gateway.check("POST", URL, fields, BODY)
    assert verdict.stack.hops == 2
    assert dict(verdict.headers())["X-Verified-Keyid"] == f"{AGENT.thumbprint}, {BROKER.thumbprint}"
