"""Profiles per destination in the agent pipeline and the relay (in-process, no network): the first
matching rule wins, ``svc`` stays byte-identical, a web-bot-auth destination gets the drafts' shape,
a relay stacks a web-bot-auth label correctly and refuses to mix profiles."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.errors import VerificationError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.core.profiles import SVC, WEB_BOT_AUTH
from signing_proxy.core.signatures import Component, Message, VerificationKey, VerifiedStack, verify_stack
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.errors import ProxyError
from signing_proxy.metrics import Metrics
from signing_proxy.net.framing import Outgoing
from signing_proxy.proxy.pipeline import BearerStore, Signer, SigningPipeline
from signing_proxy.proxy.profiles import ProfileSelector
from signing_proxy.proxy.relay import RelayPipeline
from signing_proxy.verify import DirectoryResolver, RequestVerifier, VerifierPolicy
from tests.oracle import WEB_BOT_AUTH_REQUIRED, oracle_sign, oracle_verify
from tests.verify.fakes import FakeFetch

AGENT = SigningKey.generate()
BROKER = SigningKey.generate()
EDGE = SigningKey.generate()
NOW = 1_900_000_000.0
RULES = {
    "rules": [
        {"hosts": ["*.shop.example"], "profile": "web-bot-auth"},
        {"hosts": ["api.shop.example"], "profile": "svc"},  # never reached: the rule above matches first
        {"hosts": ["legacy.example"], "profile": "web-bot-auth", "signature_agent": "string"},
    ]
}


def _config(**extra: Any) -> Any:
    return parse_config({"signing": {"signature_agent": "https://agent.example"}, **extra})


def _signer(key: SigningKey = AGENT, label: str = "agent") -> Signer:
    return Signer(StaticKeyProvider(key), label=label, validity_s=300, clock=lambda: NOW)


def _prepare(url: str, selector: ProfileSelector | None, config: Any = None, method: str = "GET") -> Outgoing:
    config = config or _config(profiles=RULES)
    return SigningPipeline(
        config=config, signer=_signer(), bearers=BearerStore(()), profiles=selector
    ).prepare(method, parse_absolute_uri(url), [("Accept", "*/*")], b"", framed=False)


def _fields(out: Outgoing) -> Fields:
    lines = out.head.decode("latin-1").split("\r\n")[1:]
    return Fields(tuple(line.split(": ", 1)) for line in lines if line)  # type: ignore[misc]


def test_selector_first_match_wins_and_default_is_svc() -> None:
    selector = ProfileSelector(_config(profiles=RULES).profiles)
    assert selector.select("api.shop.example", "https", 443) is WEB_BOT_AUTH
    assert selector.select("elsewhere.example", "https", 443) is SVC
    legacy = selector.select("legacy.example", "https", 443)
    assert legacy.name == "web-bot-auth"
    assert legacy.signature_agent == "string"
    everywhere = ProfileSelector(_config(profiles={"default": "web-bot-auth"}).profiles)
    assert everywhere.select("anything.example", "https", 443) is WEB_BOT_AUTH


def test_learning_is_off_by_default_and_bounded_when_on() -> None:
    off = ProfileSelector(_config().profiles)
    assert not off.learn("a.example", WEB_BOT_AUTH, "https", 443)
    assert off.select("a.example", "https", 443) is SVC
    on = ProfileSelector(_config(profiles={"learn": True, "learn_max_hosts": 2, **RULES}).profiles)
    for host in ("a.example", "b.example", "c.example"):
        assert on.learn(host, WEB_BOT_AUTH, "https", 443)
    assert on.learned == 2
    assert on.select("a.example", "https", 443) is SVC  # the oldest was forgotten
    assert on.select("c.example", "https", 443) is WEB_BOT_AUTH
    assert not on.learn("x.shop.example", SVC, "https", 443)  # a rule naming the host wins over learning


def test_svc_destination_is_byte_identical_with_or_without_profiles() -> None:
    url = "https://elsewhere.example/a?b=c"
    with_rules = _prepare(url, ProfileSelector(_config(profiles=RULES).profiles))
    without = _prepare(url, None, _config())
    assert with_rules.head == without.head
    assert with_rules.profile == "svc"


def test_web_destination_gets_the_drafts_shape_and_verifies() -> None:
    url = "https://www.shop.example/cart"
    out = _prepare(url, ProfileSelector(_config(profiles=RULES).profiles))
    fields = _fields(out)
    assert out.profile == "web-bot-auth"
    assert fields.combined("signature-agent") == 'agent="https://agent.example"'
    assert fields.combined("authorization") is None  # not sent empty: the web profile does not cover it
    assert fields.combined("content-digest") is None
    raw = fields.combined("signature-input") or ""
    assert raw.startswith('agent=("@authority" "signature-agent";key="agent");')
    assert 'tag="web-bot-auth"' in raw
    assert ";expires=1900000300;" in raw
    message = Message("GET", parse_absolute_uri(url), fields)
    lookup = lambda _e, _i: VerificationKey(AGENT.public)  # noqa: E731
    assert verify_stack(message, b"", lookup, now=NOW + 1).profile == "web-bot-auth"


def test_two_web_requests_carry_different_nonces() -> None:
    selector = ProfileSelector(_config(profiles=RULES).profiles)
    inputs = {
        _fields(_prepare("https://www.shop.example/", selector)).combined("signature-input") for _ in range(2)
    }
    assert len(inputs) == 2


def _relay(**extra: Any) -> RelayPipeline:
    config = parse_config(
        {
            "mode": "relay",
            "signing": {"label": "broker", "signature_agent": "https://broker.example"},
            "relay": {"verify": False},
            **extra,
        }
    )
    return RelayPipeline(config, _signer(BROKER, "broker"))


def test_relay_stacks_a_web_bot_auth_label_that_both_verifiers_accept() -> None:
    url = "https://www.shop.example/cart"
    first = _prepare(url, ProfileSelector(_config(profiles=RULES).profiles))
    relay = _relay(profiles=RULES)
    out = asyncio.run(relay.prepare("GET", parse_absolute_uri(url), list(_fields(first)), b"", framed=False))
    fields = _fields(out)
    assert (
        fields.combined("signature-agent") == 'agent="https://agent.example", broker="https://broker.example"'
    )
    raw = fields.combined("signature-input") or ""
    assert '"signature";key="agent" "signature-input";key="agent"' in raw
    keys = {AGENT.thumbprint: AGENT.public, BROKER.thumbprint: BROKER.public}
    message = Message("GET", parse_absolute_uri(url), fields)
    lookup = lambda e, _i: VerificationKey(keys[e.keyid])  # noqa: E731
    assert verify_stack(message, b"", lookup, now=NOW + 1).hops == 2
    pyauth_keys = {k: v.key for k, v in keys.items()}
    accepted = oracle_verify(
        "GET",
        url,
        list(fields),
        b"",
        pyauth_keys,
        labels=("agent", "broker"),
        check_time=False,
        require_components=WEB_BOT_AUTH_REQUIRED,
    )
    assert accepted == ["agent", "broker"]


def test_relay_covers_again_the_fields_and_query_params_a_third_partys_label_covers() -> None:
    """An agent signing with another library may cover any field and named query parameters; the
    relay's label covers the agent's label and all it covered (the drafts' rule), and both verify."""
    url = "https://www.shop.example/cart?item=42&ref=mail%20x"
    covered = ("@authority", '"signature-agent";key="agent"', "user-agent", '"@query-param";name="ref"')
    lines = oracle_sign(
        "GET",
        url,
        [("User-Agent", "ExampleBot/1.0"), ("Signature-Agent", 'agent="https://agent.example"')],
        b"",
        keyid=AGENT.thumbprint,
        private_key=AGENT._private,
        now=int(NOW),
        components=covered,
        tag="web-bot-auth",
    )
    relay = _relay(profiles=RULES)
    out = asyncio.run(relay.prepare("GET", parse_absolute_uri(url), lines, b"", framed=False))
    fields = _fields(out)
    broker = fields.combined("signature-input") or ""
    assert '"user-agent" "@query-param";name="ref"' in broker.split("broker=", 1)[1]
    keys = {AGENT.thumbprint: AGENT.public, BROKER.thumbprint: BROKER.public}
    message = Message("GET", parse_absolute_uri(url), fields)
    lookup = lambda e, _i: VerificationKey(keys[e.keyid])  # noqa: E731
    assert verify_stack(message, b"", lookup, now=NOW + 1).hops == 2
    pyauth = {k: v.key for k, v in keys.items()}
    assert oracle_verify(
        "GET",
        url,
        list(fields),
        b"",
        pyauth,
        labels=("agent", "broker"),
        check_time=False,
        require_components=(),
    ) == ["agent", "broker"]
    changed = Message("GET", parse_absolute_uri(url.replace("mail%20x", "mail%20y")), fields)
    with pytest.raises(VerificationError) as err:
        verify_stack(changed, b"", lookup, now=NOW + 1)
    assert err.value.reason == "bad-signature"


def _oracle_agent(
    url: str, lines: list[tuple[str, str]], covered: tuple[str, ...], body: bytes
) -> list[tuple[str, str]]:
    return oracle_sign(
        "POST",
        url,
        lines,
        body,
        keyid=AGENT.thumbprint,
        private_key=AGENT._private,
        now=int(NOW),
        components=covered,
        tag="web-bot-auth",
    )


def test_relay_covers_host_and_content_length_as_its_head_writes_them() -> None:
    """A label may cover Host and Content-Length, which a relay does not forward but writes anew:
    the relay's label covers them as its head writes them, and both labels verify at the next hop."""
    url = "https://www.shop.example/cart"
    body = b"order=1"
    lines = [
        ("Host", "www.shop.example"),
        ("Content-Length", str(len(body))),
        ("Signature-Agent", 'agent="https://agent.example"'),
    ]
    covered = ("@authority", '"signature-agent";key="agent"', "host", "content-length")
    signed = _oracle_agent(url, lines, covered, body)
    out = asyncio.run(
        _relay(profiles=RULES).prepare("POST", parse_absolute_uri(url), signed, body, framed=True)
    )
    fields = _fields(out)  # the head as written: Host and Content-Length from the relay itself
    assert '"host" "content-length"' in (fields.combined("signature-input") or "").split("broker=", 1)[1]
    keys = {AGENT.thumbprint: AGENT.public, BROKER.thumbprint: BROKER.public}
    message = Message("POST", parse_absolute_uri(url), fields)
    lookup = lambda e, _i: VerificationKey(keys[e.keyid])  # noqa: E731
    assert verify_stack(message, body, lookup, now=NOW + 1).hops == 2
    pyauth = {k: v.key for k, v in keys.items()}
    assert oracle_verify(
        "POST",
        url,
        list(fields),
        body,
        pyauth,
        labels=("agent", "broker"),
        check_time=False,
        require_components=(),
    ) == ["agent", "broker"]


@pytest.mark.parametrize(
    ("field", "value"), [("expect", "100-continue"), ("te", "trailers"), ("x-hop", "1")], ids=str
)
def test_relay_refuses_a_label_covering_a_field_it_does_not_forward(field: str, value: str) -> None:
    """Expect, hop-by-hop fields and those Connection names are not forwarded: the next verifier
    could never check such a label. Refused, saying which, rather than relayed to fail there."""
    url = "https://www.shop.example/cart"
    lines = [
        (field, value),
        ("Connection", "x-hop"),
        ("Signature-Agent", 'agent="https://agent.example"'),
    ]
    signed = _oracle_agent(url, lines, ("@authority", '"signature-agent";key="agent"', field), b"")
    with pytest.raises(ProxyError) as refused:
        asyncio.run(_relay(profiles=RULES).prepare("POST", parse_absolute_uri(url), signed, b"", framed=True))
    assert (refused.value.status, refused.value.reason) == (400, "covered-field-not-forwarded")
    assert repr(field) in refused.value.detail


def _pin(tmp_path: Path, key: SigningKey, name: str) -> str:
    path = tmp_path / f"{name}.pub.jwk"
    path.write_text(json.dumps(key.public.jwk()))
    return str(path)


async def _through(relay: RelayPipeline, url: str, out: Outgoing) -> Outgoing:
    try:
        return await relay.prepare("GET", parse_absolute_uri(url), list(_fields(out)), b"", framed=False)
    finally:
        await relay.close()


def test_a_relay_chain_on_an_agent_without_signature_agent_verifies(tmp_path: Path) -> None:
    """arch-05 lets an agent sign web-bot-auth without a Signature-Agent (its key pinned where it is
    verified); each relay adds its own member and covers it. A verifying relay refused the stack
    (403 signature-agent-not-covered: the agent's label did not cover the Signature-Agent sent), and
    so did a verifier at the end: every member in it was a relay's own, covered by its label."""
    url = "https://www.shop.example/cart"
    agent_config = parse_config({"signing": {"signature_agent": ""}, "profiles": RULES})
    first = _prepare(url, ProfileSelector(agent_config.profiles), agent_config)
    assert _fields(first).combined("signature-agent") is None
    second = asyncio.run(_through(_relay(profiles=RULES), url, first))
    edge = RelayPipeline(
        parse_config(
            {
                "mode": "relay",
                "signing": {"label": "edge", "signature_agent": "https://edge.example"},
                "relay": {
                    "verify": True,
                    "pinned_agent_keys": [_pin(tmp_path, AGENT, "agent")],
                    "pinned_broker_keys": [_pin(tmp_path, BROKER, "broker")],
                },
                "profiles": RULES,
            }
        ),
        _signer(EDGE, "edge"),
    )
    fetch = FakeFetch()  # no directory is fetched: none is named for any label's key
    edge.verifier = RequestVerifier(DirectoryResolver(fetch), edge.policy, clock=lambda: NOW + 1)
    fields = _fields(asyncio.run(_through(edge, url, second)))
    assert (
        fields.combined("signature-agent") == 'broker="https://broker.example", edge="https://edge.example"'
    )
    pinned = VerifierPolicy(
        pinned_agent_keys=(AGENT.public,), pinned_broker_keys=(BROKER.public, EDGE.public)
    )
    verifier = RequestVerifier(DirectoryResolver(fetch), pinned, clock=lambda: NOW + 1)

    async def verify() -> VerifiedStack:
        try:
            return await verifier.verify("GET", url, fields, b"")
        finally:
            await verifier.close()

    stack = asyncio.run(verify())
    assert [(s.label, s.key_source) for s in stack.signatures] == [
        ("agent", "pinned"),
        ("broker", "pinned"),
        ("edge", "pinned"),
    ]
    assert (stack.signature_agent, stack.directory) == ("", None)
    assert fetch.calls == []


def test_a_relay_label_steps_aside_for_an_agents_signature_agent_member_of_its_name() -> None:
    """An agent may add Signature-Agent members it does not cover. One named like the relay's
    label made the relay append a second member of that key, and building its base failed with a
    FieldError nobody answered: a 500 and a traceback for a stack that verifies."""
    url = "https://www.shop.example/cart"
    first = _prepare(url, ProfileSelector(_config(profiles=RULES).profiles))
    lines = [
        (name, value + ', broker="https://evil.example"')
        if name.lower() == "signature-agent"
        else (name, value)
        for name, value in _fields(first)
    ]
    out = asyncio.run(
        _relay(profiles=RULES).prepare("GET", parse_absolute_uri(url), lines, b"", framed=False)
    )
    fields = _fields(out)
    assert fields.combined("signature-agent") == (
        'agent="https://agent.example", broker="https://evil.example", broker2="https://broker.example"'
    )
    keys = {AGENT.thumbprint: AGENT.public, BROKER.thumbprint: BROKER.public}
    lookup = lambda e, _i: VerificationKey(keys[e.keyid])  # noqa: E731
    stack = verify_stack(Message("GET", parse_absolute_uri(url), fields), b"", lookup, now=NOW + 1)
    assert [signature.label for signature in stack.signatures] == ["agent", "broker2"]


def test_a_field_no_signature_base_can_be_built_from_is_a_400_and_nothing_is_attached() -> None:
    """A covered Dictionary member whose key the field names twice: no base can say which value it
    covers. The Signer answers 400 (counted under its reason) and attaches nothing; it let the
    FieldError through before (a 500 and a traceback), which the relay's label no longer provokes."""
    metrics = Metrics()
    signer = Signer(
        StaticKeyProvider(AGENT), label="agent", validity_s=300, clock=lambda: NOW, metrics=metrics
    )
    fields = Fields([("Signature-Agent", 'agent="https://a.example", agent="https://b.example"')])
    message = Message("GET", parse_absolute_uri("https://shop.example/"), fields)
    with pytest.raises(ProxyError) as refused:
        signer.sign(message, components=(Component("signature-agent", key="agent"),))
    assert (refused.value.status, refused.value.reason) == (400, "duplicate-label")
    assert "more than once" in refused.value.detail
    assert fields.get_all("signature") == fields.get_all("signature-input") == []
    assert b'signing_proxy_signing_failures_total{reason="duplicate-label"} 1.0' in metrics.render()


def test_a_relays_signatures_are_counted_under_its_configured_label() -> None:
    """The label a relay stacks is made unique against what the request carries (broker2, broker3,
    ...): as a metric label, a request could have chosen any number of them."""
    url = "https://www.shop.example/cart"
    relay = _relay(profiles=RULES)
    relay.signer.metrics = Metrics()
    for extra in ("broker", "broker2", "broker3"):
        first = _prepare(url, ProfileSelector(_config(profiles=RULES).profiles))
        lines = [
            (name, f'{value}, {extra}="https://evil.example"')
            if name.lower() == "signature-agent"
            else (name, value)
            for name, value in _fields(first)
        ]
        asyncio.run(relay.prepare("GET", parse_absolute_uri(url), lines, b"", framed=False))
    assert relay.signer.metrics.callbacks.signatures == {"broker": 3}


def test_relay_refuses_to_mix_profiles() -> None:
    url = "https://www.shop.example/cart"
    spec_signed = _prepare(url, None, _config())  # the agent signed under svc
    with pytest.raises(ProxyError) as err:
        asyncio.run(
            _relay(profiles=RULES).prepare(
                "GET", parse_absolute_uri(url), list(_fields(spec_signed)), b"", framed=False
            )
        )
    assert err.value.reason == "profile-mix"
    assert err.value.status == 403


def test_relay_refuses_a_covered_host_it_would_write_otherwise() -> None:
    """A relay writes Host anew (RFC 9112 section 3.2.2): a label covering a Host spelled otherwise
    (the default port written out) was forwarded, to fail at the next verifier; now it is refused
    here, saying how the relay writes it."""
    url = "https://www.shop.example/cart"
    lines = [("Host", "www.shop.example:443"), ("Signature-Agent", 'agent="https://agent.example"')]
    signed = _oracle_agent(url, lines, ("@authority", '"signature-agent";key="agent"', "host"), b"")
    with pytest.raises(ProxyError) as refused:
        asyncio.run(_relay(profiles=RULES).prepare("POST", parse_absolute_uri(url), signed, b"", framed=True))
    assert (refused.value.status, refused.value.reason) == (400, "covered-field-not-forwarded")
    assert "'www.shop.example'" in refused.value.detail
