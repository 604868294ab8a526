"""``verify.web_bot_auth`` defaults to ``auto``: web-bot-auth labels (which bind the authority only,
not the method, target or body) are accepted by every verifier but a gateway's, whose backends rely
on what it checked; ``true`` or ``false`` applies to all alike."""

from __future__ import annotations

from typing import Any

import pytest

from signing_proxy.config import VerifyConfig, parse_config
from signing_proxy.errors import ConfigError
from signing_proxy.verify.build import build_verifier
from signing_proxy.verify.gateway_build import build_gateway_verifier


@pytest.mark.parametrize(
    ("value", "gateway", "elsewhere"), [("auto", False, True), (True, True, True), (False, False, False)]
)
def test_the_setting_as_each_verifier_takes_it(value: Any, gateway: bool, elsewhere: bool) -> None:
    limits = parse_config({"verify": {"web_bot_auth": value}}).verify
    assert limits.accepts_web_bot_auth(gateway=True) is gateway
    assert limits.accepts_web_bot_auth(gateway=False) is elsewhere


def test_the_default_is_auto() -> None:
    assert parse_config({}).verify.web_bot_auth == "auto"


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_wrong_value_names_every_value_it_may_take(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"^verify\.web_bot_auth: must be true or false or auto, got "):
        parse_config({"verify": {"web_bot_auth": value}})


async def test_the_embedded_gateway_takes_the_gateways_default() -> None:
    """``build_gateway_verifier`` with no policy (the aiohttp gateway middleware's way) took the
    other verifiers' default and accepted web-bot-auth labels."""
    gateway, plain = build_gateway_verifier(), build_verifier()
    try:
        assert gateway.verifier.policy.web_bot_auth is False
        assert plain.policy.web_bot_auth is True
        told = build_gateway_verifier(limits=VerifyConfig(web_bot_auth=True))
        try:
            assert told.verifier.policy.web_bot_auth is True
        finally:
            await told.close()
    finally:
        await gateway.close()
        await plain.close()
