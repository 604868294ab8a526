"""Issue 16, item 7 ("Smaller holes"): the admin listener answers only ``admin.allow_clients``.

A real ``signing-proxy run`` with ``admin.listen`` on 127.0.0.1 port 0; an allow-list that leaves
loopback out makes this test's own client the stranger, which gets ``403 client-not-allowed``.
"""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import pytest
import requests

from signing_proxy.core.jwk import SigningKey
from tests.harness import WAIT_S, ProxyProcess

pytestmark = pytest.mark.integration

KEY = SigningKey.generate()


def admin_url(proxy: ProxyProcess) -> str:
    line = next(line for line in proxy.stderr_lines if " admin on http://" in line)
    return line.split(" admin on ", 1)[1].split()[0]


@pytest.mark.parametrize(
    ("allow_clients", "allowed"),
    [([], True), (["127.0.0.0/8"], True), (["10.0.0.0/8", "::1/128"], False)],
)
def test_smaller_holes_admin_port_refuses_clients_outside_admin_allow_clients(
    tmp_path: Path, allow_clients: list[str], allowed: bool
) -> None:
    config = {
        "admin": {"listen": "127.0.0.1:0", "allow_clients": allow_clients},
        "intercept": {"enabled": False},
    }
    with ProxyProcess(tmp_path, config, key=KEY) as proxy:
        base = admin_url(proxy)
        answers = {
            path: requests.get(base + path, timeout=WAIT_S, proxies={})
            for path in ("/healthz", "/metrics", "/nowhere")
        }
        own_port = requests.get(f"{proxy.url}/healthz", timeout=WAIT_S, proxies={})
    assert own_port.status_code == 200  # the proxy port keeps its own rule (access.allow_clients)
    if allowed:
        assert [answers[p].status_code for p in ("/healthz", "/metrics", "/nowhere")] == [200, 200, 404]
        return
    for path, resp in answers.items():
        assert resp.status_code == 403, path
        assert resp.headers["Content-Type"].startswith("application/problem+json")
        doc = resp.json()
        assert doc["reason"] == "client-not-allowed"
        assert "admin.allow_clients" in doc["detail"]
    assert "signing_proxy_" not in answers["/metrics"].text


def test_a_strangers_unsent_body_on_the_admin_port_does_not_hold_the_shutdown(tmp_path: Path) -> None:
    """A refused client declared a body and sent none: the admin listener waited for it (aiohttp
    lingers 10 s) before the proxy port even closed, so SIGTERM took 10 s + drain_s. With nothing in
    flight the proxy stops at once: a drain_s of 5 s bounds the admin listener's close too, and a
    stop that waited for it would take that long."""
    config = {"admin": {"listen": "127.0.0.1:0", "allow_clients": ["10.0.0.0/8"]}, "timeouts": {"drain_s": 5}}
    with ProxyProcess(tmp_path, config, key=SigningKey.generate()) as proxy:
        assert proxy.proc is not None
        with socket.create_connection(("127.0.0.1", proxy.admin_port), timeout=WAIT_S) as sock:
            sock.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")  # and no body
            assert sock.recv(4096).startswith(b"HTTP/1.1 403 ")
            started = time.monotonic()
            proxy.proc.send_signal(signal.SIGTERM)
            assert proxy.proc.wait(WAIT_S) == 0
            assert time.monotonic() - started < 3.0  # well under drain_s; it was over 10 s
