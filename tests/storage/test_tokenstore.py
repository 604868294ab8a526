"""The key store holding a token key beside file keys: the index names it by its PKCS#11 URI (no
file, never a PIN), rotation treats it like any key, and the provider signs off the loop with it
once it activates; a token key that no longer matches its entry never signs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from signing_proxy.core.jwk import PublicKey, SigningKey
from signing_proxy.core.pkcs11_uri import parse_pkcs11_uri
from signing_proxy.errors import KeyStoreError, TokenError
from signing_proxy.storage.keyindex import StoreState
from signing_proxy.storage.keystore import KeyStore, StoreWatcher, TokenKeys
from signing_proxy.storage.pkcs11 import TokenKey, TokenSlot, generate_token_key, module_for
from signing_proxy.storage.tokenstore import TokenStoreKeyProvider
from tests.softhsm import PIN, SoftHsm

pytest.importorskip("pkcs11", reason="python-pkcs11 (extra 'hsm') is not installed")

T = 1_800_000_000


def opener(hsm: SoftHsm) -> tuple[TokenSlot, TokenKeys]:
    slot = TokenSlot(module_for(hsm.module), parse_pkcs11_uri(hsm.uri("agent")), PIN)

    def open_key(uri: str, public: PublicKey) -> SigningKey:
        return TokenKey(slot, parse_pkcs11_uri(uri), public)

    return slot, open_key


def test_a_token_key_rotates_in_beside_a_file_key(tmp_path: Path, hsm: SoftHsm) -> None:
    slot, open_key = opener(hsm)
    store = KeyStore(tmp_path / "data", tokens=open_key)
    first = store.create(T, lifetime_s=86_400)
    token_key = generate_token_key(slot, parse_pkcs11_uri(hsm.uri("agent")))
    new, moved = store.rotate(T + 10, activate_in_s=600, grace_s=3600, lifetime_s=86_400, key=token_key)
    assert new.thumbprint == token_key.thumbprint
    assert [r.thumbprint for r in moved] == [first.thumbprint]
    assert not store.key_path(token_key.thumbprint).exists()  # nothing of it on disk but its name
    index = json.loads(store.index_path.read_text())
    entry = next(e for e in index["keys"] if e["thumbprint"] == token_key.thumbprint)
    assert entry["pkcs11"].startswith(hsm.uri("agent") + ";id=")
    assert PIN not in store.index_path.read_text()

    provider = TokenStoreKeyProvider(store)
    assert provider.blocking  # the store holds a token key: signatures go off the loop
    before = provider.current(T + 20)
    assert before is not None
    assert before.thumbprint == first.thumbprint
    after = provider.current(T + 10 + 600)
    assert isinstance(after, TokenKey)
    assert after.thumbprint == token_key.thumbprint
    assert after.public.verify(after.sign(b"base"), b"base")
    assert provider.unavailable() is None

    # the same store read without token access (e.g. `keys list`): public only for that key
    plain = KeyStore(tmp_path / "data").load(private=True)
    assert token_key.thumbprint not in plain.private
    assert first.thumbprint in plain.private
    assert plain.record(token_key.thumbprint) is not None


def test_a_file_only_store_keeps_the_in_line_path(tmp_path: Path, hsm: SoftHsm) -> None:
    _slot, open_key = opener(hsm)
    store = KeyStore(tmp_path / "data", tokens=open_key)
    store.create(T, lifetime_s=86_400)
    assert not TokenStoreKeyProvider(store).blocking


def test_a_key_is_added_once_and_never_signs_if_the_token_holds_another(tmp_path: Path, hsm: SoftHsm) -> None:
    slot, open_key = opener(hsm)
    store = KeyStore(tmp_path / "data", tokens=open_key)
    store.create(T, lifetime_s=86_400)
    token_key = generate_token_key(slot, parse_pkcs11_uri(hsm.uri("agent")))
    store.rotate(T + 10, activate_in_s=0, grace_s=3600, lifetime_s=86_400, key=token_key)
    with pytest.raises(KeyStoreError) as caught:
        store.rotate(T + 20, activate_in_s=0, grace_s=3600, lifetime_s=86_400, key=token_key, force=True)
    assert caught.value.reason == "key-exists"
    # an entry whose URI now names a different key pair on the token
    other = generate_token_key(slot, parse_pkcs11_uri(hsm.uri("other")))
    impostor = TokenKey(slot, other.uri, token_key.public)
    with pytest.raises(TokenError) as refused:
        impostor.sign(b"base")
    assert refused.value.reason == "token-key-mismatch"


def test_the_index_refuses_a_pin_in_a_token_entry(tmp_path: Path, hsm: SoftHsm) -> None:
    slot, open_key = opener(hsm)
    store = KeyStore(tmp_path / "data", tokens=open_key)
    store.create(T, lifetime_s=86_400, key=generate_token_key(slot, parse_pkcs11_uri(hsm.uri("agent"))))
    index = json.loads(store.index_path.read_text())
    index["keys"][0]["pkcs11"] += "?pin-value=1234"
    store.index_path.write_text(json.dumps(index))
    with pytest.raises(KeyStoreError) as caught:
        store.load(private=False)
    assert caught.value.reason == "store-malformed"
    assert "pin-value" in str(caught.value)
    assert "1234" not in str(caught.value)


def test_blocking_is_set_before_a_reload_serves_a_token_key(
    tmp_path: Path, hsm: SoftHsm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``keys rotate --now --pkcs11`` onto a store of file keys: ``blocking`` was set only after the
    reload had served the new state, so a request in between signed with the token key on the event
    loop. At the moment a state holding a token key is served, ``blocking`` already says so; back to
    file keys only, it turns False once the token key is gone."""
    slot, open_key = opener(hsm)
    store = KeyStore(tmp_path / "data", tokens=open_key)
    first = store.create(T, lifetime_s=86_400)
    provider = TokenStoreKeyProvider(store)
    served: list[tuple[bool, bool]] = []  # (the state served holds a token key, blocking then)
    serve = StoreWatcher._install

    def watched(watcher: StoreWatcher, state: StoreState) -> None:
        holds = any(isinstance(state.signing_key(t), TokenKey) for t in (T + 20, T + 40))
        served.append((holds, provider.blocking))
        serve(watcher, state)

    monkeypatch.setattr(StoreWatcher, "_install", watched)
    assert not provider.blocking
    token_key = generate_token_key(slot, parse_pkcs11_uri(hsm.uri("agent")))
    store.rotate(T + 10, activate_in_s=0, grace_s=3600, lifetime_s=86_400, key=token_key)
    assert provider.reload(force=True)
    assert isinstance(provider.current(T + 20), TokenKey)
    assert served == [(True, True)]  # the token key is served: blocking already said so
    store.revoke(token_key.thumbprint, T + 30)  # back to the file key alone
    assert provider.reload(force=True)
    assert served[1] == (False, True)  # still True while the state that held one is served
    current = provider.current(T + 40)
    assert current is not None
    assert current.thumbprint == first.thumbprint
    assert not provider.blocking  # file keys only again: the in-line path
