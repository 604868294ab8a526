"""The README's ten-line exchange (examples/exchange.py), run as written, behind a real proxy."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from signing_proxy.core.jwk import SigningKey
from tests.harness import WAIT_S, ProxyProcess
from tests.verify.directory_host import served_directory

ROOT = Path(__file__).resolve().parents[2]
AGENT = SigningKey.generate()


def listening_port(proc: subprocess.Popen[str]) -> int:
    """The port from aiohttp's ``Running on http://127.0.0.1:PORT`` line (port 0 asked, bound one shown)."""
    found: list[int] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "Running on http://" in line:
                found.append(int(line.split("Running on http://", 1)[1].split()[0].rsplit(":", 1)[1]))
                break
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(WAIT_S) or not found:
        raise AssertionError("examples/exchange.py did not start")
    return found[0]


@pytest.mark.integration
def test_readme_exchange_verifies_what_the_proxy_signs(tmp_path: Path) -> None:
    assert "examples/exchange.py" in (ROOT / "README.md").read_text()
    exchange = subprocess.Popen(
        # the directory host is on loopback: allow-listed, as a private deployment would list its own
        [sys.executable, "-u", str(ROOT / "examples/exchange.py"), "0", "127.0.0.1/32"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{listening_port(exchange)}/svc.v1.ExchangeService/DiscoverResources"
        with (
            served_directory(AGENT) as base,
            ProxyProcess(tmp_path, {"signing": {"signature_agent": base}}, key=AGENT) as proxy,
        ):
            signed = requests.post(url, json={"ver": "1.0"}, proxies={"http": proxy.url}, timeout=WAIT_S)
        unsigned = requests.post(url, json={"ver": "1.0"}, proxies={}, timeout=WAIT_S)
    finally:
        exchange.terminate()
        exchange.wait(WAIT_S)
        if exchange.stdout is not None:
            exchange.stdout.close()
    assert signed.status_code == 200, signed.text
    assert signed.json() == {"requester_key": AGENT.thumbprint, "directory": base}
    assert unsigned.status_code == 401
    assert unsigned.json()["reason"] == "missing-signature"


def code_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_the_readme_shows_the_example_exchange_as_written() -> None:
    """Issue 15 attack 6: the README's exchange must be the one that polls revocation lists under the
    egress policy (examples/exchange.py, run above), not an older wiring without them."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("**Verifying, in your own service.**", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    example = (ROOT / "examples/exchange.py").read_text()
    code = example.split('"""', 2)[2].split("\nif __name__", 1)[0]
    assert code_lines(block) == code_lines(code)
