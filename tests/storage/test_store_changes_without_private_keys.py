"""A missing, corrupt or too-open key file blocks no ``revoke`` and no ``prune`` (they read no private
key), and ``rotate`` only when that key has to sign until the new one activates (``--now`` and
``--force`` go ahead).

The fault: every change read every unrevoked key's private file first, so one bad file made the
store impossible to change, ``--force`` included: not even the broken key could be revoked.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from signing_proxy.storage.keystore import KeyStore, KeyStoreError
from tests.harness import run_cli

T = 1_800_000_000  # 2027-01-15T08:00:00Z


def garbage(path: Path) -> None:
    path.write_bytes(b"garbage\n")


def deleted(path: Path) -> None:
    path.unlink()


def too_open(path: Path) -> None:
    path.chmod(0o644)


BREAKS: dict[str, Callable[[Path], None]] = {"garbage": garbage, "deleted": deleted, "too-open": too_open}


@pytest.fixture
def store(tmp_path: Path) -> KeyStore:
    s = KeyStore(tmp_path / "data")
    s.create(T, lifetime_s=100_000)
    return s


@pytest.mark.parametrize("broken", sorted(BREAKS))
def test_revoke_and_prune_never_read_a_private_key(store: KeyStore, broken: str) -> None:
    (first,) = store.load().records
    second, _ = store.rotate(T + 10, grace_s=600)
    BREAKS[broken](store.key_path(first.thumbprint))
    assert store.revoke(first.thumbprint, T + 20) is True
    assert not store.key_path(first.thumbprint).exists()
    assert [r.thumbprint for r in store.prune(T + 30)] == [first.thumbprint]
    assert [r.thumbprint for r in store.load().records] == [second.thumbprint]


@pytest.mark.parametrize("broken", sorted(BREAKS))
def test_a_pending_key_with_a_broken_file_blocks_no_revocation_of_another(
    store: KeyStore, broken: str
) -> None:
    (first,) = store.load().records
    pending, _ = store.rotate(T + 10, grace_s=600, activate_in_s=3600)
    BREAKS[broken](store.key_path(pending.thumbprint))
    assert store.revoke(pending.thumbprint, T + 20) is True  # the broken key itself, too
    second, _ = store.rotate(T + 30, grace_s=600, activate_in_s=3600)
    BREAKS[broken](store.key_path(second.thumbprint))
    assert store.revoke(first.thumbprint, T + 40) is True


@pytest.mark.parametrize("broken", sorted(BREAKS))
def test_rotate_refuses_only_a_signing_key_it_needs_and_only_without_force(
    store: KeyStore, broken: str
) -> None:
    (first,) = store.load().records
    path = store.key_path(first.thumbprint)
    BREAKS[broken](path)
    with pytest.raises(KeyStoreError) as refused:
        store.rotate(T + 10, grace_s=600, activate_in_s=3600)
    assert str(refused.value).startswith(f"{path}: ")
    assert "rotate with --now, or --force" in str(refused.value)
    store.rotate(T + 10, grace_s=600, activate_in_s=3600, force=True)


@pytest.mark.parametrize("broken", sorted(BREAKS))
def test_rotate_now_replaces_a_broken_signing_key(store: KeyStore, broken: str) -> None:
    (first,) = store.load().records
    BREAKS[broken](store.key_path(first.thumbprint))
    new, _ = store.rotate(T + 10, grace_s=600)
    assert store.load(private=False).signing_record(T + 10) == new


def test_the_keys_commands_revoke_and_prune_a_store_with_a_garbage_key_file(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    assert run_cli("keys", "rotate", "--data-dir", data).returncode == 0  # creates the store
    rotated = run_cli("keys", "rotate", "--now", "--data-dir", data)
    assert rotated.returncode == 0, rotated.stderr
    store = KeyStore(tmp_path / "data")
    first, second = sorted(store.load().records, key=lambda r: r.created_at)
    garbage(store.key_path(first.thumbprint))
    os.chmod(store.key_path(first.thumbprint), 0o600)
    revoked = run_cli("keys", "revoke", "--force", "--data-dir", data, "--", first.thumbprint)
    assert revoked.returncode == 0, revoked.stderr
    pruned = run_cli("keys", "prune", "--data-dir", data)
    assert pruned.returncode == 0, pruned.stderr
    assert [r.thumbprint for r in store.load().records] == [second.thumbprint]
