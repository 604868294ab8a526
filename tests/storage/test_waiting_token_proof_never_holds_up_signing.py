"""Proving a key that waits for its activation never makes the key signing now fail or unready.

The fault: the probe proved a waiting key on its token (when first seen, then every 30 s) on the
probe thread, holding the lock of its PKCS#11 module, which every token of that module shares. With
the waiting key on a token out of reach (a network HSM whose calls hang) and the key signing now on
a healthy token of the same module, every signature timed out, the module stalled (each later one
refused at once as token-unavailable) and ``/readyz`` said token-timeout. And a waiting key whose
proof failed on the signing key's own token for a reason of its own marked that token failed:
``/readyz`` not ready while the key signing now signed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.core.jwk import PublicKey, SigningKey
from signing_proxy.core.pkcs11_uri import Pkcs11Uri, parse_pkcs11_uri
from signing_proxy.storage.keystore import KeyStore, TokenKeys
from signing_proxy.storage.pkcs11 import (
    Pkcs11Module,
    TokenKey,
    TokenSlot,
    generate_token_key,
    module_for,
)
from signing_proxy.storage.tokenstore import TokenStoreKeyProvider
from tests.softhsm import PIN, SoftHsm, signing_outcomes, two_tokens

p11 = pytest.importorskip("pkcs11", reason="python-pkcs11 (extra 'hsm') is not installed")

WAIT_S = 10.0  # bound on every wait of these tests: nothing here takes a second when it works


def slots_per_token(module: Pkcs11Module, timeout_s: float) -> tuple[dict[str, TokenSlot], TokenKeys]:
    """As ``token_keys_for``: one slot per token, shared by its keys (one session, one health)."""
    slots: dict[str, TokenSlot] = {}

    def slot(uri: Pkcs11Uri) -> TokenSlot:
        assert uri.token is not None
        return slots.setdefault(uri.token, TokenSlot(module, uri, PIN, timeout_s))

    def open_key(uri_text: str, public: PublicKey) -> SigningKey:
        uri = parse_pkcs11_uri(uri_text)
        return TokenKey(slot(uri), uri, public)

    slot(parse_pkcs11_uri("pkcs11:token=tok-a;object=any"))
    slot(parse_pkcs11_uri("pkcs11:token=tok-b;object=any"))
    return slots, open_key


def test_a_key_waiting_on_an_unreachable_token_of_the_module_never_holds_up_the_signing_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    hsm = two_tokens(tmp_path, monkeypatch)
    module = module_for(hsm.module)
    slots, open_key = slots_per_token(module, timeout_s=1.0)
    signing = generate_token_key(slots["tok-a"], parse_pkcs11_uri("pkcs11:token=tok-a;object=now"))
    waiting = generate_token_key(slots["tok-b"], parse_pkcs11_uri("pkcs11:token=tok-b;object=next"))
    now = time.time()
    store = KeyStore(tmp_path / "data", tokens=open_key)
    store.create(now - 60, lifetime_s=86_400, key=signing)
    store.rotate(now - 30, activate_in_s=3600, grace_s=3600, lifetime_s=86_400, key=waiting)
    provider = TokenStoreKeyProvider(store)

    # tok-b is now out of reach: a session on it hangs (until the test lets it go)
    contacted, settled, release = threading.Event(), threading.Event(), threading.Event()
    real_session = Pkcs11Module.session

    def session(mod: Pkcs11Module, uri: Pkcs11Uri, pin: str | None, *, rw: bool = False) -> Any:
        if uri.token == "tok-b":
            contacted.set()
            settled.set()
            release.wait(WAIT_S)
        return real_session(mod, uri, pin, rw=rw)

    monkeypatch.setattr(Pkcs11Module, "session", session)
    with module.lock:
        module.reset()  # no pooled session left: the next call on tok-b opens one

    def probe() -> None:
        try:
            provider.probe()
        finally:
            settled.set()

    caplog.set_level(logging.INFO, logger="signing_proxy.keys")
    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        assert settled.wait(WAIT_S)  # the probe is done, or hangs in tok-b holding the module

        assert asyncio.run(signing_outcomes(provider, signing.thumbprint)) == ["signed", "signed", "signed"]
        assert provider.unavailable() is None  # /readyz: ready, no warning
        assert not contacted.is_set()  # the waiting key's token was not called ahead
        assert module.stalled is None
        assert slots["tok-a"].failure is None
    finally:
        release.set()
        prober.join(WAIT_S)
    assert not prober.is_alive()
    (line,) = [r.getMessage() for r in caplog.records if "not ahead" in r.getMessage()]
    assert waiting.thumbprint in line
    assert "is proved at its activation" in line
    assert PIN not in line


def test_a_failed_proof_of_the_next_key_on_the_signing_keys_token_leaves_that_key_ready(
    tmp_path: Path, hsm: SoftHsm, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = module_for(hsm.module)
    slot = TokenSlot(module, parse_pkcs11_uri(hsm.uri("agent")), PIN, 2.0)

    def open_key(uri_text: str, public: PublicKey) -> SigningKey:
        return TokenKey(slot, parse_pkcs11_uri(uri_text), public)  # one token: one slot

    signing = generate_token_key(slot, parse_pkcs11_uri(hsm.uri("agent")))
    following = generate_token_key(slot, parse_pkcs11_uri(hsm.uri("next")))
    real_open = TokenKey._open

    def refused_for_the_next_key(key: TokenKey) -> tuple[int, Any]:
        """The token fails every call for the next key's object (CKR_FUNCTION_FAILED, say): not one
        of the key-only reasons, so the slot, shared with the key signing now, took it as its own."""
        if key.thumbprint == following.thumbprint:
            raise p11.FunctionFailed()
        return real_open(key)

    monkeypatch.setattr(TokenKey, "_open", refused_for_the_next_key)
    now = time.time()
    store = KeyStore(tmp_path / "data", tokens=open_key)
    store.create(now - 60, lifetime_s=86_400, key=signing)
    store.rotate(now - 30, activate_in_s=600, grace_s=3600, lifetime_s=86_400, key=following)
    provider = TokenStoreKeyProvider(store)
    for _ in range(3):
        provider.probe()
        # the warning ahead names the next key; the key signing now stays ready
        assert provider.unavailable() == "next-key-token-unavailable"
    assert slot.failure is None
    current = provider.current(time.time())
    assert isinstance(current, TokenKey)
    assert current.thumbprint == signing.thumbprint
    assert current.public.verify(current.sign_within(b"base"), b"base")
