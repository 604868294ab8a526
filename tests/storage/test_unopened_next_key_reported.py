"""A key published to sign later that this process cannot open is reported ahead of its activation.

The fault: a waiting key the reload could not open (a token entry without ``signing.pkcs11.module``,
a PIN variable or file missing, a key file gone bad) never got into the state's private keys, so
neither the store's proofs nor ``unavailable`` knew of it: ``/readyz`` stayed 200 without a word
until the activation, when every request got 503. The key signing now, if it cannot be opened, is
no key at all (``no-valid-signing-key``), as before.
"""

from __future__ import annotations

import time
from pathlib import Path

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import PublicKey, SigningKey
from signing_proxy.core.pkcs11_uri import parse_pkcs11_uri
from signing_proxy.errors import ConfigError, TokenError
from signing_proxy.service.app import ProxyApp
from signing_proxy.service.keys import key_provider_for
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider
from signing_proxy.storage.pkcs11 import TokenKey, TokenSlot, module_for
from signing_proxy.storage.tokenstore import TokenStoreKeyProvider

PIN = "4711-user"  # never contacted: the module path below does not exist


def token_key() -> TokenKey:
    uri = parse_pkcs11_uri("pkcs11:token=agent-keys;object=agent-2")
    return TokenKey(TokenSlot(module_for("/nonexistent/libtoken.so"), uri), uri, SigningKey.generate().public)


class Opener:
    """How the store opens token entries: refused while ``refusal`` is set (no module, no PIN)."""

    def __init__(self, refusal: Exception | None) -> None:
        self.refusal = refusal

    def __call__(self, uri_text: str, public: PublicKey) -> SigningKey:
        if self.refusal is not None:
            raise self.refusal
        uri = parse_pkcs11_uri(uri_text)
        return TokenKey(TokenSlot(module_for("/nonexistent/libtoken.so"), uri, PIN), uri, public)


def test_a_next_token_key_without_a_module_is_reported_ahead(tmp_path: Path) -> None:
    opener = Opener(ConfigError("signing.pkcs11.module: required for key store entry"))
    store = KeyStore(tmp_path / "data", tokens=opener)
    now = time.time()
    first = store.create(now - 60, lifetime_s=86_400)
    provider = TokenStoreKeyProvider(store)
    assert provider.unavailable() is None
    following = token_key()
    store.rotate(now, key=following, activate_in_s=600)  # `keys rotate --pkcs11` from elsewhere
    assert provider.reload() is False
    provider.probe()
    assert provider.unavailable() == "next-key-key-unopened"
    signing = provider.current(time.time())  # the key signing now signs on until the activation
    assert signing is not None
    assert signing.thumbprint == first.thumbprint
    assert provider.current(now + 601) is None  # then no key: what /readyz warned of
    opener.refusal = None  # the configuration put right: the next check opens it
    assert provider.reload() is True
    assert provider.unavailable() is None


def test_a_next_token_key_without_its_pin_names_the_token_reason(tmp_path: Path) -> None:
    opener = Opener(TokenError("token-pin-missing", "the environment variable AGENT_PIN is not set"))
    store = KeyStore(tmp_path / "data", tokens=opener)
    now = time.time()
    store.create(now - 60, lifetime_s=86_400)
    provider = TokenStoreKeyProvider(store)
    store.rotate(now, key=token_key(), activate_in_s=600)
    assert provider.reload() is False
    assert provider.unavailable() == "next-key-token-pin-missing"
    assert provider.reload() is False  # read again at every check: still reported
    assert provider.unavailable() == "next-key-token-pin-missing"


def test_a_next_key_file_gone_bad_is_reported_ahead(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "data")
    now = time.time()
    store.create(now - 60, lifetime_s=86_400)
    provider = StoreKeyProvider(store)
    following, _moved = store.rotate(now, activate_in_s=600)
    store.key_path(following.thumbprint).write_bytes(b"garbage")  # before this process read it
    assert provider.reload() is False
    assert provider.unavailable() == "next-key-key-unopened"


def test_a_key_file_gone_bad_with_its_copy_loaded_before_is_no_warning(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "data")
    now = time.time()
    store.create(now - 60, lifetime_s=86_400)
    provider = StoreKeyProvider(store)
    following, _moved = store.rotate(now, activate_in_s=600)
    assert provider.reload() is True  # opened: this process holds its copy
    store.key_path(following.thumbprint).write_bytes(b"garbage")
    assert provider.reload(force=True) is False
    assert provider.unavailable() is None  # it signs with the copy loaded before


def test_the_key_signing_now_unopened_stays_no_valid_signing_key(tmp_path: Path) -> None:
    opener = Opener(ConfigError("signing.pkcs11.module: required for key store entry"))
    store = KeyStore(tmp_path / "data", tokens=opener)
    now = time.time()
    store.create(now - 60, lifetime_s=86_400)
    provider = TokenStoreKeyProvider(store)
    store.rotate(now, key=token_key(), activate_in_s=0, force=True)  # it signs at once
    assert provider.reload() is False
    assert provider.current(time.time()) is None  # no key: /readyz says no-valid-signing-key
    assert provider.unavailable() is None  # not a key of the future


def test_readiness_warns_of_an_unopened_next_key_without_going_unready(tmp_path: Path) -> None:
    config = parse_config({"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "data")})
    provider = key_provider_for(config)  # no signing.pkcs11: a token entry cannot be opened
    assert isinstance(provider, StoreKeyProvider)
    KeyStore(tmp_path / "data").rotate(time.time(), key=token_key(), activate_in_s=600)
    assert provider.reload() is False
    status, doc = ProxyApp(config, provider).readiness()
    assert status == 200
    assert doc["checks"] == {"config": "ok", "signing_key": "ok", "interception_ca": "ok"}
    assert doc["next_signing_key"] == "key-unopened"
