"""Issue 16, item 7 ("Smaller holes"): the admin listener answers only ``admin.allow_clients``.

A real ``signing-proxy run`` with ``admin.listen`` on 127.0.0.1 port 0; an allow-list that leaves
loopback out makes this test's own client the stranger, which gets ``403 client-not-allowed``.
"""

from __future__ import annotations

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
