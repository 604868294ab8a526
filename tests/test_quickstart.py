"""The README's quick start, as written: run the proxy on the embedded defaults, export
HTTP_PROXY, curl a local URL, see the signed headers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import WAIT_S, free_port, wait_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_quick_start(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    assert "signing-proxy run" in readme
    assert "examples/echo_origin.py" in readme
    origin_port, proxy_port = free_port(), free_port()
    env = {**os.environ, "HOME": str(tmp_path)}  # the default data_dir lives under ~
    origin = subprocess.Popen([sys.executable, str(ROOT / "examples/echo_origin.py"), str(origin_port)])
    proxy = subprocess.Popen(
        [sys.executable, "-m", "signing_proxy", "run", "--listen", f"127.0.0.1:{proxy_port}"],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(origin_port)
        wait_port(proxy_port)
        curl_env = {**env, "http_proxy": f"http://127.0.0.1:{proxy_port}"}
        curl_env.pop("no_proxy", None)
        curl_env.pop("NO_PROXY", None)
        out = subprocess.run(
            ["curl", "-sS", f"http://127.0.0.1:{origin_port}/hello"],
            env=curl_env,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=True,
        ).stdout
    finally:
        for proc in (proxy, origin):
            proc.terminate()
            proc.wait(WAIT_S)
    assert 'Signature-Input: agent=("@method" "@target-uri" "content-digest" "authorization" ' in out
    assert "Signature: agent=:" in out
    assert "Content-Digest: sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:" in out
    assert list((tmp_path / ".local/share/signing-proxy/keys/default").glob("*.pem"))  # the key store
