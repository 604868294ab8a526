"""The README's ten-line exchange (examples/exchange.py), run as written, behind a real proxy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.harness import WAIT_S, ProxyProcess, free_port, wait_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_readme_exchange_verifies_what_the_proxy_signs(tmp_path: Path) -> None:
    assert "examples/exchange.py" in (ROOT / "README.md").read_text()
    port, pub = free_port(), free_port()
    base = f"http://127.0.0.1:{pub}"
    exchange = subprocess.Popen(
        [sys.executable, str(ROOT / "examples/exchange.py"), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port)
        config = {
            "signing": {"key": None, "signature_agent": base},
            "publish": {"listen": f"127.0.0.1:{pub}", "domain": "127.0.0.1", "public_url": base},
        }
        url = f"http://127.0.0.1:{port}/svc.v1.ExchangeService/DiscoverResources"
        with ProxyProcess(tmp_path, config) as proxy:
            signed = requests.post(url, json={"ver": "1.0"}, proxies={"http": proxy.url}, timeout=WAIT_S)
        unsigned = requests.post(url, json={"ver": "1.0"}, proxies={}, timeout=WAIT_S)
    finally:
        exchange.terminate()
        exchange.wait(WAIT_S)
    assert signed.status_code == 200, signed.text
    assert signed.json()["directory"] == base
    assert len(signed.json()["requester_key"]) == 43
    assert unsigned.status_code == 401
    assert unsigned.json()["reason"] == "missing-signature"
