"""Accept-Signature challenges: what ``plan_retry`` accepts, and everything it passes back."""

from __future__ import annotations

import pytest

from signing_proxy.core.challenge import plan_retry
from signing_proxy.core.profiles import SVC, WEB_BOT_AUTH
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
