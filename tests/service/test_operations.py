"""Operations through the real process: /metrics counters move, the admin port answers probes, and
no secret reaches /metrics, the logs or `config check`."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from signing_proxy.core.jwk import SigningKey
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin

pytestmark = pytest.mark.integration

KEY = SigningKey.generate()
SECRET = "s3cr3t-bearer-value"
PROXY_PASSWORD = "pr0xy-passw0rd"


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.match(r"([a-z_]+)(\{[^}]*\})? (\S+)$", line)
        if not match or match.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return 0.0


def test_metrics_move_after_a_signed_request_and_hold_no_secret(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(SECRET)
    token.chmod(0o600)
    users = tmp_path / "users"
    users.write_text(f"agent:{PROXY_PASSWORD}\n")
    users.chmod(0o600)
    config = {
        "credentials": [{"hosts": ["127.0.0.1"], "bearer_file": str(token), "allow_plaintext": True}],
        "access": {"proxy_auth_file": str(users)},
        "admin": {"listen": "127.0.0.1:0"},
        "log": {"format": "json", "level": "debug"},
    }
    with VerifyingOrigin() as origin, ProxyProcess(tmp_path, config, key=KEY) as proxy:
        origin.trust(KEY)
        admin = proxy.admin_port
        assert admin
        proxied = {"http": proxy.url.replace("http://", f"http://agent:{PROXY_PASSWORD}@")}
        before = requests.get(f"{proxy.url}/metrics", timeout=WAIT_S, proxies={}).text
        for _ in range(3):
            assert requests.post(origin.url("/x"), data=b"abc", proxies=proxied, timeout=WAIT_S).json()[
                "verified"
            ]
        assert requests.get(origin.url("/y"), proxies={"http": proxy.url}, timeout=WAIT_S).status_code == 407
        after = requests.get(f"{proxy.url}/metrics", timeout=WAIT_S, proxies={}).text
        via_admin = requests.get(f"http://127.0.0.1:{admin}/metrics", timeout=WAIT_S, proxies={})
        health = requests.get(f"http://127.0.0.1:{admin}/healthz", timeout=WAIT_S, proxies={})
        ready = requests.get(f"http://127.0.0.1:{admin}/readyz", timeout=WAIT_S, proxies={})
        other = requests.get(f"http://127.0.0.1:{admin}/anything", timeout=WAIT_S, proxies={})
        check = subprocess.run(
            [sys.executable, "-m", "signing_proxy", "config", "check", str(tmp_path / "config.yaml")],
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )
    assert (
        metric(after, "signing_proxy_requests_total", mode="agent", outcome="signed")
        - metric(before, "signing_proxy_requests_total", mode="agent", outcome="signed")
        == 3
    )
    assert metric(after, "signing_proxy_requests_total", outcome="proxy-auth-required") == 1
    assert metric(after, "signing_proxy_signatures_added_total", label="agent") == 3
    assert metric(after, "signing_proxy_request_bytes_total") == 9
    assert metric(after, "signing_proxy_response_bytes_total") > 0
    assert metric(after, "signing_proxy_upstream_latency_seconds_count") == 3
    assert "signing_proxy_signing_key_remaining_seconds" in after
    assert "signing_proxy_leaf_cache_entries" in after
    assert via_admin.status_code == 200
    assert metric(via_admin.text, "signing_proxy_signatures_added_total", label="agent") == 3
    assert health.status_code == 200
    assert ready.status_code == 200
    assert ready.json()["checks"]["signing_key"] == "ok"
    assert other.status_code == 404
    assert check.returncode == 0
    for text in (after, via_admin.text, "\n".join(proxy.stderr_lines), check.stdout, check.stderr):
        assert SECRET not in text
        assert PROXY_PASSWORD not in text
        assert KEY.to_jwk()["d"] not in text
    assert origin.arrivals[-1].header("authorization") == f"Bearer {SECRET}"  # it was used, just never shown


def test_signing_failures_are_counted_by_reason(tmp_path: Path) -> None:
    with VerifyingOrigin() as origin, ProxyProcess(tmp_path, {}, key=KEY) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
            sock.sendall(
                f"GET {origin.url('/u')} HTTP/1.1\r\nHost: x\r\nAuthorization: caf\xe9\r\n"
                "Connection: close\r\n\r\n".encode("latin-1")
            )
            while sock.recv(65536):
                pass
        text = requests.get(f"{proxy.url}/metrics", timeout=WAIT_S, proxies={}).text
    assert metric(text, "signing_proxy_signing_failures_total", reason="non-ascii-component") == 1
    assert origin.arrivals == []
