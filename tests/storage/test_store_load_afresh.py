"""``StoreWatcher.load_afresh``: what a worker of ``run --workers`` serves at its start is the store
as it is on disk, never its parent's copy, and never below the revocations the parent has read.

The fault: a restarted worker started from the parent's start-up copy (every private key loaded
then, keys revoked since included) and re-read the store; when ``keys.json`` could not be read at
that moment, it "kept the keys loaded before" and signed with a revoked key. An older ``keys.json``
put back was taken as it was.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.keys import RevocationList
from signing_proxy.errors import KeyStoreError
from signing_proxy.service.keys import key_provider_for
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider
from signing_proxy.storage.storewatch import STORE_BUSY, STORE_ROLLED_BACK, RevocationFloor

NOTHING = RevocationList(0)


def store_provider(data: Path) -> StoreKeyProvider:
    """The provider ``run`` builds for a configuration without ``signing.key``."""
    provider = key_provider_for(parse_config({"data_dir": str(data)}))
    assert isinstance(provider, StoreKeyProvider)
    return provider


def rotate_and_revoke(data: Path, now: float) -> tuple[str, str]:
    """``keys rotate --now`` then ``keys revoke`` of the key signing before: (revoked, signing now)."""
    store = KeyStore(data)
    before = store.load(private=False).signing_record(now)
    assert before is not None
    new, _ = store.rotate(now)
    assert store.revoke(before.thumbprint, now) is True
    return before.thumbprint, new.thumbprint


def test_the_parent_holds_no_private_key_once_it_forgets_them(tmp_path: Path) -> None:
    provider = store_provider(tmp_path / "data")
    now = time.time()
    assert provider.current(now) is not None
    provider.forget_private_keys()
    assert dict(provider.state().private) == {}
    assert provider.current(now) is None
    assert provider.state().records  # the public state stays: windows, revocations


def test_a_store_that_cannot_be_read_is_refused_not_served_from_the_copy_before(tmp_path: Path) -> None:
    data = tmp_path / "data"
    provider = store_provider(data)  # the parent's copy: the first key, signing
    now = time.time()
    revoked, _current = rotate_and_revoke(data, now)
    index = KeyStore(data).index_path
    index.chmod(0o640)
    with pytest.raises(KeyStoreError) as refused:
        provider.load_afresh(NOTHING)
    assert str(index) in str(refused.value)
    key = provider.current(now)  # what the worker would have signed with: it exits instead
    assert key is not None
    assert key.thumbprint == revoked  # the copy before, unchanged (never served)


def test_a_store_read_afresh_serves_what_the_index_says_and_nothing_of_the_copy_before(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    provider = store_provider(data)
    now = time.time()
    revoked, current = rotate_and_revoke(data, now)
    provider.load_afresh(NOTHING)
    key = provider.current(now)
    assert key is not None
    assert key.thumbprint == current
    assert provider.key_for(revoked, now) is None
    assert provider.state().revocations.revoked == {revoked}
    assert set(provider.state().private) == {current}


def test_a_key_file_gone_is_not_taken_from_the_copy_before(tmp_path: Path) -> None:
    """A key the fresh load cannot open does not sign in this worker: the copy before is the
    parent's, and the same thumbprint there may be a key revoked by an index this one predates."""
    data = tmp_path / "data"
    provider = store_provider(data)
    now = time.time()
    first = provider.current(now)
    assert first is not None
    KeyStore(data).key_path(first.thumbprint).unlink()
    provider.load_afresh(NOTHING)
    assert provider.current(now) is None
    assert provider.unavailable() is None  # the key signing now, not a key waiting to sign


def test_an_index_that_revokes_less_than_the_floor_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    provider = store_provider(data)
    now = time.time()
    older = tmp_path / "older"
    shutil.copytree(KeyStore(data).path, older)  # a backup, taken before the revocation
    revoked, _current = rotate_and_revoke(data, now)
    floor = RevocationFloor(KeyStore(data), provider.state().revocations)
    assert floor.check().revoked == {revoked}  # what the parent read
    shutil.rmtree(KeyStore(data).path)
    shutil.copytree(older, KeyStore(data).path)  # the older keys.json put back, its key file too
    assert floor.check().revoked == {revoked}  # never fewer
    with pytest.raises(KeyStoreError) as refused:
        provider.load_afresh(floor.floor)
    assert refused.value.reason == STORE_ROLLED_BACK
    assert revoked in str(refused.value)
    assert provider.key_for(revoked, now) is not None  # the parent's copy, as it was: never served


def test_an_index_with_an_older_as_of_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    provider = store_provider(data)
    as_of = provider.state().revocations.as_of
    later = RevocationList(as_of + 3600)
    with pytest.raises(KeyStoreError) as refused:
        provider.load_afresh(later)
    assert refused.value.reason == STORE_ROLLED_BACK
    provider.load_afresh(RevocationList(as_of))  # the same: served


def test_a_store_locked_past_the_wait_is_refused_as_busy(tmp_path: Path) -> None:
    data = tmp_path / "data"
    provider = store_provider(data)
    fd = os.open(KeyStore(data).path / ".lock", os.O_RDWR)  # a `keys` command holding the lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(KeyStoreError) as refused:
            provider.load_afresh(NOTHING, lock_wait_s=0.05)
    finally:
        os.close(fd)
    assert refused.value.reason == STORE_BUSY
    provider.load_afresh(NOTHING, lock_wait_s=0.05)  # free again: read at once
