"""``run --workers N``: a worker the parent restarts loads the key store from disk, never from the
parent's start-up copy, and never below the revocations the parent has read.

The fault: a restarted worker started from the parent's copy of the store (every private key loaded
at start, keys revoked since included) and re-read it; when ``keys.json`` could not be read at that
moment (its mode loosened, a ``keys`` command holding the lock), it kept that copy: it signed with
the revoked key, and published a revocation list without it, while its sibling refused the key. An
older ``keys.json`` put back was taken as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import requests

from signing_proxy.storage.keystore import KeyStore
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, children, run_cli, wait_for

pytestmark = pytest.mark.integration

PROBES = 12  # requests, each on a new connection: the kernel spreads them over the workers


def signing_now(data: Path) -> str:
    listed = run_cli("keys", "list", "--json", "--data-dir", str(data))
    assert listed.returncode == 0, listed.stderr
    thumbprint: str = json.loads(listed.stdout)["signing"]
    return thumbprint


def announced(proxy: ProxyProcess) -> list[str]:
    """The keyid each worker's "listening on" line names, in order."""
    return [line.split("keyid=")[1].split()[0] for line in list(proxy.stderr_lines) if "listening on" in line]


def signed_by(origin: VerifyingOrigin, proxy: ProxyProcess) -> set[str]:
    """The keyids of ``PROBES`` requests through the proxy, as the origin verified them."""
    before = len(origin.arrivals)
    for _ in range(PROBES):
        resp = requests.get(
            origin.url("/k"), proxies={"http": proxy.url}, timeout=WAIT_S, headers={"Connection": "close"}
        )
        assert resp.status_code == 200, resp.text
    arrivals = origin.arrivals[before:]
    assert all(a.verified for a in arrivals), [a.reason for a in arrivals]
    return {keyid for a in arrivals for keyid in a.keyids}


def rotate_and_revoke(data: Path, proxy: ProxyProcess) -> tuple[str, str]:
    """``keys rotate --now`` and ``keys revoke`` of the key signing before, seen by both workers."""
    revoked = signing_now(data)
    assert run_cli("keys", "rotate", "--now", "--data-dir", str(data)).returncode == 0
    done = run_cli("keys", "revoke", "--data-dir", str(data), "--", revoked)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: proxy.said("1 revoked") >= 2, "both workers reading the revocation")
    return revoked, signing_now(data)


def kill_a_worker(proxy: ProxyProcess) -> set[int]:
    assert proxy.proc is not None
    first = children(proxy.proc.pid)
    assert len(first) == 2
    os.kill(min(first), signal.SIGKILL)
    return first


def restart_settled(proxy: ProxyProcess) -> None:
    """Until the restarted worker listens, or the parent said why it did not start."""
    wait_for(lambda: len(announced(proxy)) >= 3 or proxy.said("not started") >= 1, "the worker's restart")


def test_a_restarted_worker_never_signs_with_a_key_revoked_while_keys_json_cannot_be_read(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    assert run_cli("keys", "rotate", "--data-dir", str(data)).returncode == 0  # the store, with K1
    config = {"data_dir": str(data), "signing": {"key": None}}
    with (
        VerifyingOrigin() as origin,
        ProxyProcess(tmp_path, config, extra_args=("--workers", "2")) as proxy,
    ):
        wait_for(lambda: len(announced(proxy)) >= 2, "both workers listening")
        revoked, current = rotate_and_revoke(data, proxy)
        origin.trust(*KeyStore(data).load(private=False).publics.values())
        index = KeyStore(data).index_path
        index.chmod(0o640)  # a backup agent, or configuration management, loosens its mode
        wait_for(lambda: proxy.said("key store not reloaded") >= 2, "both workers finding it unreadable")
        kill_a_worker(proxy)
        restart_settled(proxy)
        assert announced(proxy)[2:] == [], (
            f"a restarted worker signs with {announced(proxy)[2:]}, {revoked} revoked"
        )
        refusal = [line for line in proxy.stderr_lines if "not started" in line]
        assert str(index) in refusal[0], refusal
        assert signed_by(origin, proxy) == {current}  # its sibling serves meanwhile, never the revoked key
        index.chmod(0o600)
        wait_for(lambda: len(announced(proxy)) >= 3, "the worker started once the index is readable")
        assert announced(proxy)[2] == current
        assert signed_by(origin, proxy) == {current}
        assert proxy.said("not started") == 1  # said once, though tried every second


def test_a_restarted_worker_refuses_an_older_keys_json_put_back(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert run_cli("keys", "rotate", "--data-dir", str(data)).returncode == 0  # the store, with K1
    store = KeyStore(data).path
    older = tmp_path / "older"
    shutil.copytree(store, older)  # a backup, K1's key file in it
    config = {"data_dir": str(data), "signing": {"key": None}}
    with ProxyProcess(tmp_path, config, extra_args=("--workers", "2")) as proxy:
        assert proxy.proc is not None
        wait_for(lambda: len(announced(proxy)) >= 2, "both workers listening")
        revoked, current = rotate_and_revoke(data, proxy)
        newer = tmp_path / "newer"
        shutil.copytree(store, newer)
        reloaded = proxy.said("configuration reloaded")
        proxy.proc.send_signal(signal.SIGHUP)  # the parent reads the store too, before the workers reload
        wait_for(lambda: proxy.said("configuration reloaded") >= reloaded + 2, "both workers reloading")
        shutil.rmtree(store)
        shutil.copytree(older, store)  # the backup put back: K1 listed, not revoked, its key file there
        wait_for(lambda: proxy.said("stays revoked in this process") >= 2, "both workers keeping K1 revoked")
        kill_a_worker(proxy)
        restart_settled(proxy)
        assert announced(proxy)[2:] == [], (
            f"a restarted worker signs with {announced(proxy)[2:]}, {revoked} revoked"
        )
        refusal = [line for line in proxy.stderr_lines if "not started" in line]
        assert revoked in refusal[0], refusal
        assert str(store) in refusal[0], refusal
        shutil.rmtree(store)
        shutil.copytree(newer, store)  # the store as it was: the worker starts
        wait_for(lambda: len(announced(proxy)) >= 3, "the worker started once the newer index is back")
        assert announced(proxy)[2] == current
