"""What a SIGHUP reload cannot apply it names, and keeps as it runs: ``log.format`` (the log handler's
formatter is set once at start, and the access log rebuilt in the new format mixed text and JSON
lines in one stream), and a gateway's ``verify`` and ``egress`` (its verifier is built at start)."""

from __future__ import annotations

from pathlib import Path

from signing_proxy.config import Config, parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.service.app import ProxyApp


def config(tmp: Path, **sections: object) -> Config:
    return parse_config({"data_dir": str(tmp), "intercept": {"enabled": False}, **sections})


async def test_a_new_log_format_waits_for_the_restart_and_the_access_log_keeps_the_old(
    tmp_path: Path,
) -> None:
    app = ProxyApp(config(tmp_path), StaticKeyProvider(SigningKey.generate()))
    try:
        assert app.handler.policy.access_log.json is False
        pending = app.reload(config(tmp_path, log={"format": "json", "level": "warning"}))
        assert pending == ["log.format"]  # before: [], and "configuration reloaded"
        assert app.handler.policy.access_log.json is False  # before: JSON lines amid the text ones
        assert app.config.log.format == "text"
        assert app.config.log.level == "warning"  # the rest of the section applies
    finally:
        await app.stop(drain_s=0)


async def test_a_gateways_verify_and_egress_wait_for_the_restart(tmp_path: Path) -> None:
    def gateway(**sections: object) -> Config:
        return config(tmp_path, mode="gateway", gateway={"upstream": "http://127.0.0.1:9"}, **sections)

    app = ProxyApp(gateway(), StaticKeyProvider(SigningKey.generate()))
    try:
        pending = app.reload(gateway(verify={"max_validity_s": 60}, egress={"fetch_timeout_s": 1.0}))
        assert pending == ["verify", "egress"]  # before: [], the start-up verifier verifying on
        assert app.config.verify.max_validity_s == 3600
        assert app.config.egress.fetch_timeout_s == 5.0
    finally:
        await app.stop(drain_s=0)
