"""An exchange call and a bound retrieval fetch keep the spec's profile and their bound key, whatever a
profile rule, a learned host or a challenge retry asks (web-bot-auth would sign with the current key,
drop the Requester and the key the URL or the delegation is bound to)."""

from __future__ import annotations

import json
from pathlib import Path

from signing_proxy.config import parse_config
from signing_proxy.core.challenge import plan_retry
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.core.profiles import PROFILES, SVC, WEB_BOT_AUTH
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.net.upstream import ResponseHead
from signing_proxy.proxy.challenges import ChallengeHold
from signing_proxy.proxy.pipeline import BearerStore, Signer, SigningPipeline
from signing_proxy.proxy.profiles import ProfileSelector
from signing_proxy.proxy.requester import RequesterInjector
from tests.proxy.test_transactions import Rig, T, bound, sent_fields

CALL = parse_absolute_uri("https://exchange.example/v1/svc.v1.ExchangeService/DiscoverResources")
CHALLENGE = b'sig1=("@authority");tag="web-bot-auth"'


def exchange_pipeline(profiles: dict[str, object]) -> tuple[SigningPipeline, ProfileSelector]:
    config = parse_config(
        {
            "profiles": profiles,
            "requester": {
                "id": "a1",
                "domain": "agent.example",
                "type": "REQUESTER_TYPE_AGENT",
                "exchanges": ["https://exchange.example/v1"],
            },
        }
    )
    assert config.requester is not None  # the section above configures one
    keys = StaticKeyProvider(SigningKey.generate())
    selector = ProfileSelector(config.profiles)
    signer = Signer(keys, label="agent", validity_s=300)
    requester = RequesterInjector(config.requester, keys)
    return SigningPipeline(config, signer, BearerStore(()), requester, None, selector), selector


def signed_call(pipeline: SigningPipeline) -> tuple[str | None, bool]:
    out = pipeline.sign_fields("POST", CALL, [("Content-Type", "application/json")], b'{"uris":[]}')
    return out.profile, "requester" in json.loads(out.body)


def challenged(selector: ProfileSelector, url: str) -> None:
    """``url``'s origin answers 401 asking for web-bot-auth, and the proxy learns from it."""
    hold = ChallengeHold("svc", None, lambda t: selector.learn(t.host, WEB_BOT_AUTH, t.scheme, t.port), "")
    head = ResponseHead(
        status=401,
        reason="",
        version="1.1",
        content_length=0,
        keep_alive=True,
        headers=[(b"Accept-Signature", CHALLENGE)],
    )
    assert hold(head, parse_absolute_uri(url))


def test_a_host_learned_from_a_challenge_does_not_reach_its_exchange_calls() -> None:
    pipeline, selector = exchange_pipeline({"learn": True})
    challenged(selector, "https://exchange.example/anything")  # the exchange's own origin
    assert (
        selector.select("exchange.example", "https", 443) is WEB_BOT_AUTH
    )  # learned, for its other requests
    assert signed_call(pipeline) == (SVC.name, True)


def test_a_challenge_teaches_its_own_origin_only() -> None:
    """Learning was keyed by host name: a web-bot-auth challenge over plain http, or on another
    port (anyone on the path can send one), switched the https origin of that name."""
    _, selector = exchange_pipeline({"learn": True})
    challenged(selector, "http://news.example:8080/x")
    assert selector.select("news.example", "http", 8080) is WEB_BOT_AUTH
    assert selector.select("news.example", "https", 443) is SVC
    assert selector.select("news.example", "http", 80) is SVC


def test_a_profile_rule_naming_the_exchange_host_does_not_reach_its_exchange_calls() -> None:
    pipeline, _ = exchange_pipeline({"rules": [{"hosts": ["exchange.example"], "profile": "web-bot-auth"}]})
    assert signed_call(pipeline) == (SVC.name, True)


def test_a_challenge_retry_of_a_bound_fetch_keeps_the_transactions_key(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    url = bound(rig.first)
    rig.answer({"agent_identity_hash": rig.first, "retrieval_endpoint": url})
    rig.clock.now = T + 20
    current = rig.rotate(grace_s=100)  # the first key still verifies; the second signs by default
    rig.clock.now = T + 30
    pipeline = SigningPipeline(
        config=rig.config, signer=rig.signer, bearers=BearerStore(()), transactions=rig.transactions
    )
    first = pipeline.prepare("GET", parse_absolute_uri(url), [], b"", framed=False)
    plan = plan_retry(CHALLENGE.decode(), PROFILES.get(first.profile or ""))
    retry = pipeline.prepare("GET", parse_absolute_uri(url), [], b"", framed=False, retry=plan)
    for attempt in (first, retry):
        assert attempt.keyid == rig.first != current
        assert sent_fields(attempt).combined("signature-key") is not None  # presented
