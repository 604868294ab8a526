"""A key store entry naming a token key this process cannot open (no ``signing.pkcs11.module``, no
PIN) after ``keys rotate --pkcs11`` run with another configuration: the reload installs the new
index (windows, revocations: what it says is served), the key it cannot open cannot sign, the keys
it had keep signing within the new windows; it is reported once per version of the index, and the
in-process client keeps signing."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from signing_proxy.client import Signer
from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.pkcs11_uri import parse_pkcs11_uri
from signing_proxy.service.keys import key_provider_for
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider
from signing_proxy.storage.pkcs11 import TokenKey, TokenSlot, module_for

UNSET = "SIGNING_PROXY_TEST_UNSET_PIN"
CANNOT_OPEN = {
    "no-module": ({}, "signing.pkcs11.module: required for key store entry (or module-path in the URI)"),
    "no-pin": (
        {"pkcs11": {"module": "/nonexistent/libtoken.so", "pin_env": UNSET}},
        f"key store entry: the environment variable {UNSET} is not set or blank (token-pin-missing)",
    ),
}


def rotate_in_a_token_key(data: Path) -> str:
    """``keys rotate --pkcs11 URI`` from another configuration: an index entry naming a token key
    (activating in an hour, so the file key still signs now)."""
    uri = parse_pkcs11_uri("pkcs11:token=agent-keys;object=agent-1")
    on_token = TokenKey(
        TokenSlot(module_for("/nonexistent/libtoken.so"), uri), uri, SigningKey.generate().public
    )
    KeyStore(data).rotate(time.time(), key=on_token, activate_in_s=3630)
    return on_token.thumbprint


@pytest.mark.parametrize("case", sorted(CANNOT_OPEN))
def test_a_token_entry_that_cannot_be_opened_leaves_the_old_keys_signing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    monkeypatch.delenv(UNSET, raising=False)
    signing, message = CANNOT_OPEN[case]
    data = tmp_path / "data"
    config = parse_config({"data_dir": str(data), "signing": signing})
    provider = key_provider_for(config)
    assert isinstance(provider, StoreKeyProvider)
    before = provider.current(time.time())
    assert before is not None
    token = rotate_in_a_token_key(data)
    with caplog.at_level(logging.INFO, logger="signing_proxy"):
        for force in (False, True, True):  # the periodic check, then SIGHUPs
            assert provider.reload(force=force) is False
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    store = data / "keys" / "default"
    assert [r.getMessage() for r in errors] == [
        f"key store {store}: key {token} not opened, it cannot sign until it opens: {message}"
    ]
    assert all(r.exc_info is None for r in errors)  # one line, no traceback
    assert len(provider.state().records) == 2  # the new index is served: windows, revocations
    after = provider.current(time.time())
    assert after is not None
    assert after.thumbprint == before.thumbprint


def test_the_in_process_client_keeps_signing_with_the_old_key(tmp_path: Path) -> None:
    data = tmp_path / "data"
    signer = Signer.from_config({"data_dir": str(data)}, refresh_every_s=0)
    signed = signer.sign("GET", "https://example.com/", [], b"")
    assert signed is not None
    rotate_in_a_token_key(data)
    signer.refresh()  # raised ConfigError, and so did every request signed after it
    signer.refresh(force=True)
    again = signer.sign("GET", "https://example.com/", [], b"")
    assert again is not None
    assert again.keyid == signed.keyid
