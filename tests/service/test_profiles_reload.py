"""A configuration reload (SIGHUP) swaps the ``profiles`` rules; hosts learned from challenges stay
while ``profiles.learn`` stays on and are forgotten when it is turned off."""

from __future__ import annotations

from pathlib import Path

from signing_proxy.config import Config, parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.core.profiles import SVC, WEB_BOT_AUTH
from signing_proxy.service.app import ProxyApp


def _config(tmp: Path, **profiles: object) -> Config:
    return parse_config(
        {
            "data_dir": str(tmp),
            "intercept": {"enabled": False},
            "log": {"access_log": False},
            "profiles": profiles,
        }
    )


async def test_reload_swaps_rules_and_keeps_learned_hosts_while_learning(tmp_path: Path) -> None:
    app = ProxyApp(_config(tmp_path, learn=True), StaticKeyProvider(SigningKey.generate()))
    try:
        assert app.profiles.select("news.example", "https", 443) is SVC
        assert app.profiles.learn(
            "learned.example", WEB_BOT_AUTH, "https", 443
        )  # what a challenge from its origin does
        rules = [{"hosts": ["news.example"], "profile": "web-bot-auth"}]
        app.reload(_config(tmp_path, learn=True, rules=rules))
        assert app.profiles.select("news.example", "https", 443) is WEB_BOT_AUTH
        assert app.profiles.select("learned.example", "https", 443) is WEB_BOT_AUTH
        app.reload(_config(tmp_path, rules=rules))
        assert app.profiles.select("learned.example", "https", 443) is SVC
    finally:
        await app.stop(drain_s=0)
