"""Accept-Signature challenges: what ``plan_retry`` accepts, and everything it passes back."""

from __future__ import annotations

import dataclasses

import pytest

from signing_proxy.core.challenge import plan_retry
from signing_proxy.core.errors import FieldError
from signing_proxy.core.profiles import SVC, WEB_BOT_AUTH, signature_agent_field
from signing_proxy.core.signatures import Component


def test_a_web_bot_auth_challenge_plans_its_components_and_nonce() -> None:
    plan = plan_retry('sig1=("@authority" "@method" "signature-agent");tag="web-bot-auth";nonce="n1"', SVC)
    assert plan is not None
    assert plan.profile.components == (Component("@authority"), Component("@method"))
    assert plan.nonce == "n1"
    assert not plan.digest


def test_content_digest_and_a_bare_nonce() -> None:
    plan = plan_retry('a=("@authority" "content-digest");tag="web-bot-auth";nonce', SVC)
    assert plan is not None
    assert plan.digest
    assert plan.nonce is None
    assert plan.profile.components == WEB_BOT_AUTH.components


@pytest.mark.parametrize(
    "challenge",
    [
        'sig1=("@authority")',  # no tag: the spec's profile has nothing to change
        'sig1=("@authority");tag="other"',
        'sig1=("@authority" "authorization");tag="web-bot-auth"',  # not ours to cover
        'sig1=("@authority" "@query-param";name="q");tag="web-bot-auth"',
        'sig1=("@authority");tag="web-bot-auth";alg="rsa-pss-sha512"',
        'sig1=("@authority");tag="web-bot-auth";nonce=5',
        'sig1=("@authority");tag=web-bot-auth',  # a Token, not the String (RFC 9421 section 2.3)
        'sig1=("@authority");tag="web-bot-auth";alg=ed25519',
        "sig1=not-a-list",
        "((malformed",
    ],
)
def test_challenges_we_cannot_or_need_not_meet_are_passed_back(challenge: str) -> None:
    assert plan_retry(challenge, SVC) is None


def test_a_challenge_already_met_is_not_retried() -> None:
    asked = 'sig1=("@authority" "signature-agent");tag="web-bot-auth"'
    assert plan_retry(asked, WEB_BOT_AUTH) is None
    assert plan_retry(asked, SVC) is not None


@pytest.mark.parametrize(
    ("agent", "refused"),
    [
        ("https://agent.example", False),
        ("https://agent.example/", False),
        ("", False),  # no member is sent
        ("https://registry.example/agents/alice", True),  # a registry path: no origin
        ("http://agent.example", True),
        ("https://agent.example?x=1", True),
        ("https://user@agent.example", True),
    ],
)
def test_a_retry_needs_an_origin_for_its_signature_agent_member(agent: str, refused: bool) -> None:
    """A retry is signed in the dictionary form, whatever the configuration says; protocol-02 has a
    verifier ignore a member that is no https origin, so such a retry is declined."""
    from signing_proxy.core.challenge import retry_refusal  # new: here, so the others run on old code

    plan = plan_retry('sig1=("@authority" "signature-agent");tag="web-bot-auth"', SVC)
    assert plan is not None
    refusal = retry_refusal(plan, agent)
    assert (refusal is not None) is refused
    if refusal is not None:
        assert "no https origin" in refusal


def test_a_dictionary_member_that_is_no_origin_is_never_serialized() -> None:
    """The last guard: whatever path chose the dictionary form, no member a verifier ignores goes out;
    the legacy String form (a rule's explicit choice) still takes a path."""
    agent = "https://registry.example/agents/alice"
    with pytest.raises(FieldError) as refused:
        signature_agent_field(WEB_BOT_AUTH, "agent", agent)
    assert refused.value.reason == "signature-agent-not-origin"
    value, _component = signature_agent_field(
        dataclasses.replace(WEB_BOT_AUTH, signature_agent="string"), "agent", agent
    )
    assert value == f'"{agent}"'
    assert signature_agent_field(WEB_BOT_AUTH, "agent", "https://agent.example")[0] == (
        'agent="https://agent.example"'
    )
