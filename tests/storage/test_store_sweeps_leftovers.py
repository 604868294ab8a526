"""What a change cut short leaves in a key store (a temporary holding a whole private key, a key file
no index names) is deleted by the next change (rotate, revoke, prune), under the store's lock; and
nothing else is: not a file the store would not have written, not a symbolic link, nothing outside.

The fault: SIGKILL inside ``keys rotate`` left ``.<thumbprint>.pem.<hex>.tmp`` (a private key),
``.keys.json.<hex>.tmp`` and a ``<thumbprint>.pem`` the index never referenced, and no command ever
removed them.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from signing_proxy.core.jwk import SigningKey
from signing_proxy.storage.keystore import KeyStore
from tests.harness import WAIT_S

T = 1_800_000_000  # 2027-01-15T08:00:00Z

# ``keys rotate`` killed at its n-th rename: 1, the new key's file; 2, the index
KILLED_ROTATE = """
import os, signal, sys
import signing_proxy.storage.files as files
from signing_proxy.cli.main import main
renamed, real = [], os.replace
def replace(src, dst):
    renamed.append(dst)
    if len(renamed) == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst)
files.os.replace = replace
sys.exit(main(["keys", "rotate", "--now", "--data-dir", sys.argv[1]]))
"""

CHANGES: dict[str, Callable[[KeyStore, str], object]] = {
    "rotate": lambda store, _: store.rotate(T + 20, grace_s=600),
    "revoke": lambda store, thumbprint: store.revoke(thumbprint, T + 20, force=True),
    "prune": lambda store, _: store.prune(T + 20),
}


def names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


@pytest.mark.parametrize("killed_at", [1, 2])
def test_a_rotation_killed_midway_leaves_nothing_after_the_next_change(
    tmp_path: Path, killed_at: int
) -> None:
    store = KeyStore(tmp_path / "data")
    store.create(time.time(), lifetime_s=100_000)  # the command rotates at the real time
    first = names(store.path)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_ROTATE, str(store.data_dir), str(killed_at)],
        capture_output=True,
        timeout=WAIT_S * 2,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = names(store.path) - first
    assert len(left) == killed_at, left  # a private key (and the index's temporary)
    assert any(name.endswith(".pem") or ".pem." in name for name in left)
    assert store.prune(time.time()) == ()  # nothing to prune; the change sweeps
    assert names(store.path) == first


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_each_change_deletes_only_what_the_store_itself_left(tmp_path: Path, change: str) -> None:
    store = KeyStore(tmp_path / "data")
    record = store.create(T, lifetime_s=100_000)
    revoked, _ = store.rotate(T + 10, grace_s=600)
    store.revoke(revoked.thumbprint, T + 11)
    stray = SigningKey.generate().thumbprint
    leftovers = [
        f".{stray}.pem.0123456789abcdef.tmp",  # write_atomic's temporary of a key file
        ".keys.json.fedcba9876543210.tmp",  # of the index
        f"{stray}.pem",  # a key file the index never named
        f"{revoked.thumbprint}.pem",  # a revoked key's file, a revoke cut short before its unlink
    ]
    outside = tmp_path / "elsewhere.pem"
    outside.write_bytes(b"not the store's")
    linked = SigningKey.generate().thumbprint
    kept = [
        "notes.txt",
        "backup.pem",  # not a thumbprint
        f".{stray}.pem.0123.tmp",  # not write_atomic's name
        ".keys.json.bak",
        ".incoming",  # key-sync's (deploy/kubernetes/fleet.yaml)
    ]
    for name in leftovers + kept:
        (store.path / name).write_bytes(b"x")
        (store.path / name).chmod(0o600)
    (store.path / f"{linked}.pem").symlink_to(outside)  # a link is never followed nor removed
    (store.path / f".{linked}.pem.0123456789abcdef.tmp").mkdir()  # nor a folder
    (store.root / f"{stray}.pem").write_bytes(b"x")  # another folder: not this store's business
    CHANGES[change](store, record.thumbprint)
    present = names(store.path)
    assert not present & set(leftovers)
    assert set(kept) | {f"{linked}.pem", f".{linked}.pem.0123456789abcdef.tmp"} <= present
    assert {".lock", "keys.json"} <= present
    assert (f"{record.thumbprint}.pem" in present) is (change != "revoke")
    assert outside.read_bytes() == b"not the store's"
    assert (store.root / f"{stray}.pem").exists()
    store.load()  # still a good store
