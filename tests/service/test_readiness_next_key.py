"""A key waiting for its activation that cannot sign (its token refuses the PIN, say) is reported by
``/readyz`` ahead of time as a detail, never as not-ready: the key signing now still signs, and a
replica (or a fleet) taken out of service for a key of the future would be an outage now."""

from __future__ import annotations

from pathlib import Path

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.service.app import ProxyApp
from signing_proxy.storage.storewatch import NEXT_KEY_PREFIX


class Said(StaticKeyProvider):
    def __init__(self, why: str | None) -> None:
        super().__init__(SigningKey.generate())
        self.why = why

    def unavailable(self) -> str | None:
        return self.why


def readiness(tmp_path: Path, why: str | None) -> tuple[int, dict[str, object]]:
    config = parse_config({"listen": "127.0.0.1:0", "data_dir": str(tmp_path)})
    return ProxyApp(config, Said(why)).readiness()


def test_a_next_key_that_cannot_sign_is_a_detail_not_unready(tmp_path: Path) -> None:
    status, doc = readiness(tmp_path, NEXT_KEY_PREFIX + "token-pin-incorrect")
    assert status == 200
    assert doc["status"] == "ready"
    assert doc["checks"] == {"config": "ok", "signing_key": "ok", "interception_ca": "ok"}
    assert doc["next_signing_key"] == "token-pin-incorrect"


def test_the_key_signing_now_that_cannot_sign_is_unready(tmp_path: Path) -> None:
    status, doc = readiness(tmp_path, "token-pin-incorrect")
    assert status == 503
    assert doc["checks"] == {"config": "ok", "signing_key": "token-pin-incorrect", "interception_ca": "ok"}
    assert "next_signing_key" not in doc
