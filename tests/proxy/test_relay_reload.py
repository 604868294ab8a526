"""A SIGHUP reload reaches the relay: ``verify.max_validity_s`` (and the verifier's other policy keys)
and ``signing.signature_agent`` apply to the next request, and what the relay cannot apply without a
restart (``egress``, the verifier's caches and fetch budget) is named as pending. Before, the relay
kept all of it from start-up and the reload reported nothing pending. In-process, no network: the
agent's key is pinned."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.config import Config, parse_config
from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.core.signatures import Message, attach_signature, sign_message
from signing_proxy.core.uri import Target, parse_absolute_uri
from signing_proxy.errors import ProxyError
from signing_proxy.net.framing import Outgoing
from signing_proxy.proxy.profiles import ProfileSelector
from signing_proxy.service.app import ProxyApp
from tests.proxy.test_profiles import RULES, _fields, _prepare
from tests.proxy.test_profiles import _config as agent_config

AGENT = SigningKey.generate()
RELAY = SigningKey.generate()
URL = "http://origin.example/x"
BODY = b'{"ver":"1.0"}'


def relay_config(tmp: Path, *, verifying: bool, **sections: Any) -> Config:
    pinned = tmp / "agent.jwk"
    pinned.write_text(json.dumps(AGENT.public.jwk()))
    return parse_config(
        {
            "mode": "relay",
            "data_dir": str(tmp),
            "log": {"access_log": False},
            "relay": {"verify": verifying, "pinned_agent_keys": [str(pinned)]},
            **sections,
        }
    )


def signed_lines(validity_s: int) -> list[tuple[str, str]]:
    """An agent's request valid for ``validity_s``, its key pinned at the relay (empty Signature-Agent)."""
    fields = Fields(
        [
            ("Content-Type", "application/json"),
            ("Content-Digest", content_digest(BODY)),
            ("Authorization", ""),
            ("Signature-Agent", ""),
        ]
    )
    created = int(time.time())
    message = Message("POST", parse_absolute_uri(URL), fields)
    attach_signature(fields, sign_message(message, AGENT, created=created, expires=created + validity_s))
    return list(fields)


async def relayed(app: ProxyApp, url: str, lines: list[tuple[str, str]], body: bytes = b"") -> Outgoing:
    target: Target = parse_absolute_uri(url)
    return await app.prepare("POST" if body else "GET", target, lines, body, framed=bool(body))


async def test_a_reloaded_max_validity_applies_to_the_next_request(tmp_path: Path) -> None:
    app = ProxyApp(relay_config(tmp_path, verifying=True), StaticKeyProvider(RELAY))
    try:
        assert (await relayed(app, URL, signed_lines(600), BODY)).keyid == RELAY.thumbprint
        pending = app.reload(relay_config(tmp_path, verifying=True, verify={"max_validity_s": 300}))
        assert pending == []  # a policy key: applied at once
        with pytest.raises(ProxyError) as refused:  # before: accepted, the start-up 3600 s still held
            await relayed(app, URL, signed_lines(600), BODY)
        assert (refused.value.status, refused.value.reason) == (401, "validity-too-long")
        assert (await relayed(app, URL, signed_lines(300), BODY)).keyid == RELAY.thumbprint
    finally:
        await app.stop(drain_s=0)


async def test_a_reloaded_signature_agent_goes_on_the_next_hop(tmp_path: Path) -> None:
    def config(url: str) -> Config:
        return relay_config(
            tmp_path,
            verifying=False,
            signing={"label": "broker", "signature_agent": url},
            profiles=RULES,
        )

    app = ProxyApp(config("https://a.example"), StaticKeyProvider(RELAY))
    url = "https://www.shop.example/cart"  # web-bot-auth (RULES): the relay adds its own member
    try:
        agent = list(_fields(_prepare(url, ProfileSelector(agent_config(profiles=RULES).profiles))))
        first = _fields(await relayed(app, url, agent))
        assert (
            first.combined("signature-agent") == 'agent="https://agent.example", broker="https://a.example"'
        )
        assert app.reload(config("https://b.example")) == []
        again = _fields(await relayed(app, url, agent))  # before: https://a.example, from start-up
        assert (
            again.combined("signature-agent") == 'agent="https://agent.example", broker="https://b.example"'
        )
    finally:
        await app.stop(drain_s=0)


async def test_what_the_relays_verifier_holds_from_start_up_is_named_pending(tmp_path: Path) -> None:
    app = ProxyApp(relay_config(tmp_path, verifying=True), StaticKeyProvider(RELAY))
    try:
        await relayed(app, URL, signed_lines(60), BODY)  # the verifier is built, with its caches
        changed = relay_config(
            tmp_path,
            verifying=True,
            egress={"fetch_timeout_s": 1.0},
            verify={"fetch_burst": 7, "skew_s": 2},
        )
        assert app.reload(changed) == ["egress", "verify.fetch_burst"]  # before: []
        assert app.config.egress.fetch_timeout_s == 5.0  # what runs, and what the configuration says
        assert app.config.verify.fetch_burst == 100
        assert app.config.verify.skew_s == 2  # a policy key: applied
        assert app.relay is not None
        assert app.relay.verifier is not None
        assert app.relay.verifier.policy.skew_s == 2
    finally:
        await app.stop(drain_s=0)
