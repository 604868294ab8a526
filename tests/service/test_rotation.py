"""Key rotation and revocation through a real ``signing-proxy run`` with its publication listener.

The origin is given no key: like a real verifier it fetches ``{Signature-Agent}/.well-known/
http-message-signatures-directory`` from the proxy's publish listener for every request (as served
at that moment), drops keys outside their window and keys in the revocation list, and verifies
with our verifier and with the independent ``http-message-signatures``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import load_private_key
from signing_proxy.core.keys import parse_directory, parse_revocation_list, parse_rfc3339
from signing_proxy.core.signatures import Message, attach_signature, serialize_sf_string, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, free_port, wait_for

pytestmark = pytest.mark.integration

DIRECTORY = "/.well-known/http-message-signatures-directory"
REVOCATIONS = "/.well-known/http-message-signatures-revocations.json"


def cli(proxy: ProxyProcess, *args: str, thumbprint: str | None = None) -> subprocess.CompletedProcess[str]:
    """``signing-proxy ARGS --config <the proxy's> [-- THUMBPRINT]`` (a thumbprint may start with -)."""
    tail = ["--", thumbprint] if thumbprint else []
    return subprocess.run(
        [sys.executable, "-m", "signing_proxy", *args, "--config", str(proxy.tmp / "config.yaml"), *tail],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")},
    )


@contextmanager
def publishing_proxy(tmp: Path) -> Iterator[tuple[ProxyProcess, str]]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config = {
        "log": {"format": "json"},
        "signing": {"key": None, "signature_agent": base},  # no static key: the key store signs
        "publish": {"listen": f"127.0.0.1:{port}", "domain": "agent.example", "public_url": base},
    }
    with ProxyProcess(tmp, config) as proxy:
        assert proxy.publish_port == port
        yield proxy, base


def session() -> requests.Session:
    s = requests.Session()
    s.trust_env = False
    return s


def served_keys(base: str) -> list[str]:
    resp = session().get(base + DIRECTORY, timeout=WAIT_S)
    assert resp.status_code == 200, resp.text
    assert resp.headers["Content-Type"] == "application/jwk-set+json"
    return [k.thumbprint for k in parse_directory(resp.content).keys]


def reloads(proxy: ProxyProcess) -> int:
    return sum("reloaded key store" in line for line in proxy.stderr_lines)


def sighup_and_wait(proxy: ProxyProcess, before: int) -> None:
    assert proxy.proc is not None
    proxy.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: reloads(proxy) > before, "the key store reload after SIGHUP")


def through(proxy: ProxyProcess, url: str, body: bytes = b"") -> requests.Response:
    return session().post(url, data=body, proxies={"http": proxy.url}, timeout=WAIT_S)


def test_rotation_under_continuous_traffic_refuses_nothing(tmp_path: Path) -> None:
    with VerifyingOrigin(resolve_directories=True) as origin, publishing_proxy(tmp_path) as (proxy, base):
        assert origin.keys == {}  # nothing handed to the verifier: keys come from the served directory
        (old,) = served_keys(base)
        statuses: list[int] = []
        stop = threading.Event()

        def client() -> None:
            with session() as s:
                i = 0
                while not stop.is_set():
                    resp = s.post(
                        origin.url(f"/exchange/{i}"),
                        data=b"x" * i,
                        proxies={"http": proxy.url},
                        timeout=WAIT_S,
                    )
                    statuses.append(resp.status_code)
                    i += 1

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        try:
            wait_for(lambda: len(origin.arrivals) >= 5, "traffic before the rotation")
            done = cli(proxy, "keys", "rotate", "--grace", "2s")
            assert done.returncode == 0, done.stderr
            new = done.stdout.split("new key ", 1)[1].split(":", 1)[0]
            old_end = parse_rfc3339(done.stdout.split("now ends at ", 1)[1].split()[0])
            assert old_end - time.time() <= 3
            # no SIGHUP: the running proxy notices the changed store by itself (within ~1 s)
            wait_for(lambda: any(a.keyids == [new] for a in origin.arrivals), "signing with the new key", 3)
            wait_for(lambda: time.time() > old_end + 0.5, "the end of the grace period")
            count = len(origin.arrivals)
            wait_for(lambda: len(origin.arrivals) > count + 5, "traffic after the grace period")
        finally:
            stop.set()
            thread.join(WAIT_S)
        assert statuses
        assert set(statuses) == {200}  # none refused
        arrivals = list(origin.arrivals)
        for arrival in arrivals:
            assert arrival.verified, arrival.reason
            assert arrival.oracle == "ok", arrival.oracle
            assert arrival.keyids[0] in arrival.directory_keyids  # in the directory served at that moment
        keyids = [a.keyids[0] for a in arrivals]
        switch = keyids.index(new)
        assert set(keyids[:switch]) == {old}
        assert set(keyids[switch:]) == {new}  # once moved, never back to the old key
        assert any(len(a.directory_keyids) == 2 for a in arrivals)  # both published during the grace
        assert arrivals[-1].directory_keyids == [new]
        assert served_keys(base) == [new]  # after the grace period only the new key is published


def test_revoked_key_stops_signing_at_once_and_no_valid_key_means_503(tmp_path: Path) -> None:
    with VerifyingOrigin(resolve_directories=True) as origin, publishing_proxy(tmp_path) as (proxy, base):
        (first,) = served_keys(base)
        before = reloads(proxy)
        done = cli(proxy, "keys", "rotate", "--grace", "1h")
        assert done.returncode == 0, done.stderr
        sighup_and_wait(proxy, before)
        assert through(proxy, origin.url("/a")).status_code == 200
        second = origin.arrivals[-1].keyids[0]
        assert second != first
        assert origin.arrivals[-1].verified
        pem = (tmp_path / "data" / "keys" / "default" / f"{second}.pem").read_bytes()

        before = reloads(proxy)
        done = cli(proxy, "keys", "revoke", thumbprint=second)
        assert done.returncode == 0, done.stderr
        sighup_and_wait(proxy, before)
        assert through(proxy, origin.url("/b")).status_code == 200
        arrival = origin.arrivals[-1]
        assert arrival.verified, arrival.reason
        assert arrival.keyids == [first]  # the revoked key never signed again; the old key took over
        assert second not in served_keys(base)
        revocations = session().get(base + REVOCATIONS, timeout=WAIT_S)
        assert revocations.headers["Cache-Control"] == "max-age=60"
        assert parse_revocation_list(revocations.content).revoked == {second}

        # A request signed with the revoked key (by someone who kept it) is refused by the verifier.
        url = origin.url("/stolen")
        fields = Fields(
            [
                ("Content-Digest", content_digest(b"")),
                ("Authorization", ""),
                ("Signature-Agent", serialize_sf_string(base)),
            ]
        )
        now = int(time.time())
        member = sign_message(
            Message("POST", parse_absolute_uri(url), fields),
            load_private_key(pem),
            created=now,
            expires=now + 60,
        )
        attach_signature(fields, member)
        headers: dict[str, Any] = dict(fields)
        session().post(url, data=b"", headers=headers, timeout=WAIT_S)
        stolen = origin.arrivals[-1]
        assert stolen.target_uri == url
        assert not stolen.verified
        assert second not in stolen.directory_keyids

        # Revoking the last valid key (forced): readiness fails, requests get 503, nothing unsigned leaves.
        assert cli(proxy, "keys", "revoke", thumbprint=first).returncode == 2
        before = reloads(proxy)
        done = cli(proxy, "keys", "revoke", "--force", thumbprint=first)
        assert done.returncode == 0, done.stderr
        sighup_and_wait(proxy, before)
        count = len(origin.arrivals)
        refused = through(proxy, origin.url("/c"))
        assert refused.status_code == 503
        assert refused.headers["Content-Type"] == "application/problem+json"
        assert refused.json()["reason"] == "no-valid-signing-key"
        assert len(origin.arrivals) == count
        ready = session().get(proxy.url + "/readyz", timeout=WAIT_S)
        assert ready.status_code == 503
        assert ready.json()["checks"]["signing_key"] == "no-valid-signing-key"
        directory = session().get(base + DIRECTORY, timeout=WAIT_S)
        assert directory.status_code == 503
        assert directory.json()["reason"] == "no-valid-key"

        # A rotation brings it back without a restart.
        before = reloads(proxy)
        assert cli(proxy, "keys", "rotate").returncode == 0
        sighup_and_wait(proxy, before)
        assert session().get(proxy.url + "/readyz", timeout=WAIT_S).status_code == 200
        assert through(proxy, origin.url("/d")).status_code == 200
        assert origin.arrivals[-1].verified


def test_a_registry_host_publishes_several_agents(tmp_path: Path) -> None:
    from signing_proxy.storage.keystore import KeyStore

    for agent in ("alice", "bob"):
        KeyStore(tmp_path / "data", agent).create(time.time(), lifetime_s=3600)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config = {
        "signing": {"key": None, "agent": "alice", "signature_agent": f"{base}/agents/alice"},
        "publish": {
            "listen": f"127.0.0.1:{port}",
            "domain": "registry.example",
            "public_url": base,
            "agents": ["alice", "bob"],
        },
    }
    with VerifyingOrigin(resolve_directories=True) as origin, ProxyProcess(tmp_path, config) as proxy:
        assert any("publishing on http://127.0.0.1:" in line for line in proxy.stderr_lines)
        assert through(proxy, origin.url("/x")).status_code == 200
        arrival = origin.arrivals[-1]
        assert arrival.verified, arrival.reason
        assert arrival.oracle == "ok"
        assert arrival.header("signature-agent") == f'"{base}/agents/alice"'
        assert arrival.keyids == served_keys(f"{base}/agents/alice")
        assert served_keys(f"{base}/agents/bob") != arrival.keyids
        done = cli(proxy, "keys", "list", "--agent", "bob")
        assert done.returncode == 0, done.stderr
        assert served_keys(f"{base}/agents/bob")[0] in done.stdout
