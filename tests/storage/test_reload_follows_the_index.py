"""A running process's reload serves what the store's index says whenever the index can be read: its
revocations, its revocation list and its windows, even when a key it lists cannot be opened here.

The fault: one key this process could not open (a token key ``keys rotate --pkcs11`` added from
another configuration, a key file gone bad) made the whole reload fail, and the previous state was
kept: a key ``keys revoke`` had revoked went on signing, and the old revocation list (without it)
was served, while the command had printed "it never signs again".
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.pkcs11_uri import parse_pkcs11_uri
from signing_proxy.service.keys import key_provider_for
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider
from signing_proxy.storage.pkcs11 import TokenKey, TokenSlot, module_for

T = 1_800_000_000  # 2027-01-15T08:00:00Z


def store_provider(data: Path) -> StoreKeyProvider:
    """The provider ``run`` builds for a configuration without ``signing.pkcs11``."""
    provider = key_provider_for(parse_config({"data_dir": str(data)}))
    assert isinstance(provider, StoreKeyProvider)
    return provider


def rotate_in_a_token_key(data: Path, now: float) -> str:
    """``keys rotate --pkcs11 URI`` run with another configuration: an entry naming a token key that
    this process cannot open (it has no ``signing.pkcs11.module``), activating in an hour."""
    uri = parse_pkcs11_uri("pkcs11:token=agent-keys;object=agent-2")
    on_token = TokenKey(
        TokenSlot(module_for("/nonexistent/libtoken.so"), uri), uri, SigningKey.generate().public
    )
    KeyStore(data).rotate(now, key=on_token, activate_in_s=3600)
    return on_token.thumbprint


def test_a_revoked_key_stops_signing_though_a_token_key_cannot_be_opened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    provider = store_provider(data)
    now = time.time()
    first = provider.current(now)
    assert first is not None
    token_key = rotate_in_a_token_key(data, now)
    assert KeyStore(data).revoke(first.thumbprint, now) is True  # what `keys revoke` does
    with caplog.at_level(logging.INFO, logger="signing_proxy.keys"):
        assert provider.reload() is False  # not every key opened
    state = provider.state()
    assert state.revocations.revoked == {first.thumbprint}  # the list the listener serves
    assert [k.thumbprint for k in state.directory(now, None).keys] == [token_key]
    assert provider.current(now) is None  # the revoked key never signs again; the token key cannot
    assert provider.key_for(first.thumbprint, now) is None
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert token_key in errors[0]
    assert "cannot sign until it opens" in errors[0]


def test_a_window_the_index_cut_applies_though_a_token_key_cannot_be_opened(tmp_path: Path) -> None:
    data = tmp_path / "data"
    provider = store_provider(data)
    now = time.time()
    first = provider.current(now)
    assert first is not None
    rotate_in_a_token_key(data, now)
    cut = KeyStore(data).load(private=False).record(first.thumbprint)
    assert cut is not None
    assert provider.not_after_of(first.thumbprint) != cut.not_after  # the rotation cut it
    for force in (False, True):
        assert provider.reload(force=force) is False
    assert provider.not_after_of(first.thumbprint) == cut.not_after
    signing = provider.current(now)
    assert signing is not None
    assert signing.thumbprint == first.thumbprint  # the file key signs on, until its new end
    assert provider.current(cut.not_after) is None  # and not a second after it


def test_a_broken_key_file_signs_with_the_copy_loaded_before_within_the_new_window(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = KeyStore(tmp_path / "data")
    first = store.create(T, lifetime_s=100_000)
    provider = StoreKeyProvider(store)
    store.rotate(T + 10, activate_in_s=3600, grace_s=600)
    store.key_path(first.thumbprint).write_bytes(b"garbage")
    with caplog.at_level(logging.ERROR, logger="signing_proxy.keys"):
        assert provider.reload() is False
        served = provider.state()
        assert provider.reload() is False  # re-read at every check until it opens; reported once
        assert provider.state() is served  # nothing opened since: the same state, the same key objects
    assert provider.not_after_of(first.thumbprint) == T + 10 + 3600 + 600
    signing = provider.current(T + 20)
    assert signing is not None
    assert signing.thumbprint == first.thumbprint
    (line,) = [r.getMessage() for r in caplog.records]
    assert "signs with the copy loaded before" in line
    assert str(store.key_path(first.thumbprint)) in line


def test_a_revocation_stays_when_an_older_index_is_put_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = KeyStore(tmp_path / "data")
    first = store.create(T, lifetime_s=100_000)
    second, _ = store.rotate(T + 10, grace_s=600)
    provider = StoreKeyProvider(store)
    assert provider.current(T + 20).thumbprint == second.thumbprint  # type: ignore[union-attr]
    backup = {p.name: p.read_bytes() for p in store.path.iterdir() if p.name != ".lock"}
    assert store.revoke(second.thumbprint, T + 30, force=True)
    assert provider.reload()
    as_of = provider.state().revocations.as_of
    for name, content in backup.items():  # a backup of the whole store put back
        (store.path / name).write_bytes(content)
        (store.path / name).chmod(0o600)
    with caplog.at_level(logging.ERROR, logger="signing_proxy.keys"):
        assert provider.reload(force=True)
    state = provider.state()
    assert second.thumbprint in state.revocations.revoked
    assert state.revocations.as_of == as_of  # never backwards
    assert [k.thumbprint for k in state.directory(T + 40, None).keys] == [first.thumbprint]
    assert provider.current(T + 40).thumbprint == first.thumbprint  # type: ignore[union-attr]
    assert provider.key_for(second.thumbprint, T + 40) is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"no longer lists {second.thumbprint} as revoked" in line


def test_a_key_file_put_right_signs_at_the_next_check(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "data")
    store.create(T, lifetime_s=100_000)
    provider = StoreKeyProvider(store)
    new_key = SigningKey.generate()
    second, _ = store.rotate(T + 10, grace_s=600, key=new_key)
    path = store.key_path(second.thumbprint)
    path.chmod(0o644)  # too open: refused
    assert provider.reload() is False
    assert provider.current(T + 20) is None  # the index says it signs; it cannot: nothing unsigned
    path.chmod(0o600)  # the index is unchanged: the check must read the store again anyway
    assert provider.reload() is True
    assert provider.current(T + 20).thumbprint == second.thumbprint  # type: ignore[union-attr]
