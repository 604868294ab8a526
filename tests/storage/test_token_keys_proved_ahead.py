"""A key store's token key is proved by the probe as soon as the store holds it, not when it must
first sign: a key added by ``keys rotate --pkcs11`` whose token refuses the PIN, is out of reach or
holds another key under the URI was found only at its activation, when every request got 503 while
the old key was still valid for the whole grace (``/readyz`` 200 and nothing logged until then)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.core.jwk import PublicKey, SigningKey
from signing_proxy.core.pkcs11_uri import parse_pkcs11_uri
from signing_proxy.storage.keystore import KeyStore, TokenKeys
from signing_proxy.storage.pkcs11 import Pkcs11Module, TokenKey, TokenSlot, generate_token_key, module_for
from signing_proxy.storage.tokenstore import TokenStoreKeyProvider
from tests.softhsm import PIN, SoftHsm

p11 = pytest.importorskip("pkcs11", reason="python-pkcs11 (extra 'hsm') is not installed")

WRONG_PIN = "stale-pin-9137"


def token_slot(hsm: SoftHsm, pin: str) -> TokenSlot:
    return TokenSlot(module_for(hsm.module), parse_pkcs11_uri(hsm.uri("agent")), pin)


def opener(slot: TokenSlot) -> TokenKeys:
    """As ``token_keys_for``: every key of the token shares one slot (one session, one health)."""

    def open_key(uri: str, public: PublicKey) -> SigningKey:
        return TokenKey(slot, parse_pkcs11_uri(uri), public)

    return open_key


def new_token_key(hsm: SoftHsm, label: str) -> TokenKey:
    return generate_token_key(token_slot(hsm, PIN), parse_pkcs11_uri(hsm.uri(label)))


def logged_out(hsm: SoftHsm) -> None:
    """No pooled login left (the keys were made with the right PIN): the next session logs in."""
    module = module_for(hsm.module)
    with module.lock:
        module.reset()


def counted_logins(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """One entry per session the module is asked to open with a PIN (a login, once none is pooled)."""
    logins: list[str] = []
    real_session = Pkcs11Module.session

    def counted(module: Pkcs11Module, uri: Any, pin: str | None, *, rw: bool = False) -> Any:
        logins.append("login" if pin is not None else "no login")
        return real_session(module, uri, pin, rw=rw)

    monkeypatch.setattr(Pkcs11Module, "session", counted)
    return logins


def key_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "signing_proxy.keys" and r.levelno >= logging.ERROR
    ]


def test_a_next_key_whose_token_refuses_the_pin_is_reported_before_its_activation(
    tmp_path: Path, hsm: SoftHsm, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    now = time.time()
    following = new_token_key(hsm, "next")
    logged_out(hsm)
    store = KeyStore(tmp_path / "data", tokens=opener(token_slot(hsm, WRONG_PIN)))  # a stale PIN
    first = store.create(now - 60, lifetime_s=86_400)
    new, _moved = store.rotate(now - 30, activate_in_s=600, grace_s=3600, lifetime_s=86_400, key=following)
    provider = TokenStoreKeyProvider(store)
    logins = counted_logins(monkeypatch)
    caplog.set_level(logging.INFO, logger="signing_proxy.keys")
    assert provider.unavailable() is None  # not proved yet: nothing known
    for _ in range(3):
        provider.probe()
    assert provider.unavailable() == "next-key-token-pin-incorrect"
    assert logins == ["login"]  # tried once: the token counts wrong PINs, it is never sent again
    (line,) = key_errors(caplog)  # logged once, not once per probe
    assert new.thumbprint in line
    assert "token-pin-incorrect" in line
    assert "it signs from " in line
    assert WRONG_PIN not in line
    assert PIN not in line
    current = provider.current(time.time())  # the file key still signs until the activation
    assert current is not None
    assert current.thumbprint == first.thumbprint
    assert current.public.verify(current.sign(b"base"), b"base")


def test_a_token_key_signing_now_is_proved_at_once_not_at_its_first_request(
    tmp_path: Path, hsm: SoftHsm, caplog: pytest.LogCaptureFixture
) -> None:
    now = time.time()
    key = new_token_key(hsm, "agent")
    logged_out(hsm)
    store = KeyStore(tmp_path / "data", tokens=opener(token_slot(hsm, WRONG_PIN)))
    store.create(now - 60, lifetime_s=86_400, key=key)
    provider = TokenStoreKeyProvider(store)
    caplog.set_level(logging.INFO, logger="signing_proxy.keys")
    assert provider.unavailable() is None
    provider.probe()  # no request has asked it to sign yet
    assert provider.unavailable() == "token-pin-incorrect"
    (line,) = key_errors(caplog)
    assert key.thumbprint in line
    assert "requests get 503 until its token answers" in line


def test_a_next_key_whose_token_is_away_is_reported_and_cleared_when_it_is_back(
    tmp_path: Path, hsm: SoftHsm, caplog: pytest.LogCaptureFixture
) -> None:
    now = time.time()
    following = new_token_key(hsm, "next")
    store = KeyStore(tmp_path / "data", tokens=opener(token_slot(hsm, PIN)))
    store.create(now - 60, lifetime_s=86_400)
    store.rotate(now - 30, activate_in_s=600, grace_s=3600, lifetime_s=86_400, key=following)
    provider = TokenStoreKeyProvider(store)
    caplog.set_level(logging.INFO, logger="signing_proxy.keys")
    with hsm.removed():
        provider.probe()
        assert provider.unavailable() == "next-key-token-missing"
    provider.probe()  # a failed token is tried again at every probe
    assert provider.unavailable() is None
    messages = [r.getMessage() for r in caplog.records if r.name == "signing_proxy.keys"]
    assert any("token-missing" in m for m in messages)
    assert messages[-1] == f"token key {following.thumbprint} of agent default signs again"


def test_the_next_key_gone_from_its_label_leaves_the_signing_key_of_that_token_ready(
    tmp_path: Path, hsm: SoftHsm
) -> None:
    """The next key's failure (another key pair under its label: not the id the index names) is
    its own: the token (one slot, shared with the key signing now)
    stays ready for that key, and the report names the next key, probe after probe."""
    now = time.time()
    signing = new_token_key(hsm, "agent")
    following = new_token_key(hsm, "next")
    store = KeyStore(tmp_path / "data", tokens=opener(token_slot(hsm, PIN)))
    store.create(now - 60, lifetime_s=86_400, key=signing)
    store.rotate(now - 30, activate_in_s=600, grace_s=3600, lifetime_s=86_400, key=following)
    with module_for(hsm.module).lock:  # another key pair under the label "next"
        session = token_slot(hsm, PIN).session(rw=True)
        for found in list(session.get_objects({p11.Attribute.LABEL: "next"})):
            found.destroy()
    new_token_key(hsm, "next")
    provider = TokenStoreKeyProvider(store)
    for _ in range(3):
        provider.probe()
        assert provider.unavailable() == "next-key-token-key-missing"
    current = provider.current(time.time())
    assert isinstance(current, TokenKey)
    assert current.thumbprint == signing.thumbprint
    assert current.slot.failure is None
    assert current.public.verify(current.sign(b"base"), b"base")
