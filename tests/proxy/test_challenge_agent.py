"""A challenge retry sends our Signature-Agent as a Dictionary member, which protocol-02 requires to be
an https origin (a verifier ignores any other). With a registry-path ``signing.signature_agent`` (right
for the spec's profile) the retry is declined and nothing is learned: the challenge goes back to the
agent, and no path signs a web-bot-auth request with a member no verifier would use (in-process, no
network)."""

from __future__ import annotations

import logging

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.challenge import plan_retry
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.core.profiles import PROFILES, SVC, WEB_BOT_AUTH
from signing_proxy.core.uri import Target, parse_absolute_uri
from signing_proxy.errors import ProxyError
from signing_proxy.net.framing import Outgoing
from signing_proxy.net.upstream import ResponseHead
from signing_proxy.proxy import challenges
from signing_proxy.proxy.challenges import challenge_hold
from signing_proxy.proxy.pipeline import BearerStore, Signer, SigningPipeline
from signing_proxy.proxy.profiles import ProfileSelector
from signing_proxy.ratelog import RateGate

REGISTRY = "https://registry.example/agents/alice"
URL = "https://shop.example/page"
CHALLENGE = b'sig1=("@authority" "signature-agent");tag="web-bot-auth"'
LEGACY: dict[str, object] = {
    "rules": [{"hosts": ["old.example"], "profile": "web-bot-auth", "signature_agent": "string"}]
}


def _pipeline(agent: str, profiles: dict[str, object] | None = None) -> SigningPipeline:
    config = parse_config({"signing": {"signature_agent": agent}, "profiles": profiles or {}})
    signer = Signer(StaticKeyProvider(SigningKey.generate()), label="agent", validity_s=300)
    return SigningPipeline(config, signer, BearerStore(()), profiles=ProfileSelector(config.profiles))


def _first(pipeline: SigningPipeline, url: str = URL) -> Outgoing:
    return pipeline.prepare("GET", parse_absolute_uri(url), [], b"", framed=False)


def _challenge(accept: bytes = CHALLENGE) -> ResponseHead:
    return ResponseHead(
        status=401,
        reason="",
        version="1.1",
        content_length=0,
        keep_alive=True,
        headers=[(b"Accept-Signature", accept)],
    )


def test_a_challenge_is_not_retried_with_a_registry_path_and_nothing_is_learned(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry went out as ``agent="https://registry.example/agents/alice"`` (and ``learn`` kept the
    host so): a member a protocol-02 verifier ignores, from which it finds no directory."""
    monkeypatch.setattr(
        challenges, "_declines", RateGate(challenges.DECLINE_WARN_EVERY_S)
    )  # the process's once-a-minute
    first = _first(_pipeline(REGISTRY))
    learned: list[Target] = []
    hold = challenge_hold(first, None, learned.append, REGISTRY)
    assert hold is not None
    with caplog.at_level(logging.WARNING, logger="signing_proxy.challenges"):
        assert not hold(_challenge(), parse_absolute_uri(URL))  # not held: the challenge goes back
    assert hold.plan is None
    assert learned == []
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith("https://shop.example asked for a web-bot-auth signature; retry declined")
    assert f"signing.signature_agent {REGISTRY!r} is no https origin" in message


@pytest.mark.parametrize("agent", ["https://agent.example", ""])
def test_a_challenge_is_retried_when_the_member_is_an_origin_or_absent(agent: str) -> None:
    first = _first(_pipeline(agent))
    learned: list[Target] = []
    hold = challenge_hold(first, None, learned.append, agent)
    assert hold is not None
    assert hold(_challenge(), parse_absolute_uri(URL))
    assert hold.plan is not None
    assert hold.plan.profile.name == WEB_BOT_AUTH.name
    assert learned == [parse_absolute_uri(URL)]


def test_a_legacy_string_host_with_a_path_declines_a_retry_in_the_dictionary_form() -> None:
    """A rule's ``signature_agent: string`` takes a path; a challenge asking for more components was
    retried in the dictionary form, with the path as its member."""
    first = _first(_pipeline(REGISTRY, LEGACY), "https://old.example/")
    assert first.profile == WEB_BOT_AUTH.name
    hold = challenge_hold(first, None, None, REGISTRY)
    assert hold is not None
    more = _challenge(b'sig1=("@authority" "@path");tag="web-bot-auth"')
    assert not hold(more, parse_absolute_uri("https://old.example/"))


def test_a_retry_that_would_send_a_member_no_verifier_uses_is_refused_never_sent() -> None:
    """The last guard, whatever chose the dictionary form: 500, nothing forwarded (signed or not)."""
    plan = plan_retry(CHALLENGE.decode(), PROFILES[SVC.name])
    assert plan is not None
    with pytest.raises(ProxyError) as refused:
        _pipeline(REGISTRY).prepare("GET", parse_absolute_uri(URL), [], b"", framed=False, retry=plan)
    assert (refused.value.status, refused.value.reason) == (500, "signature-agent-not-origin")
