"""The README's quick start, as written: run the proxy on the embedded defaults, export
HTTP_PROXY, curl a local URL, see the signed headers.

Both servers bind port 0 (the README's 8080 and 9000 may be taken): the example origin's handler
is served in-process, and the proxy's port is read from its "listening on" line.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

from tests.harness import WAIT_S, wait_for

ROOT = Path(__file__).resolve().parents[2]


def example(name: str) -> ModuleType:
    """``examples/<name>.py`` as a module (the examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"examples_{name}", ROOT / "examples" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def echo_origin() -> Iterator[int]:
    """The quick start's ``examples/echo_origin.py`` handler on 127.0.0.1, port 0; yields the port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), example("echo_origin").Echo)
    thread = threading.Thread(target=server.serve_forever, name="echo-origin", daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT_S)


@contextlib.contextmanager
def running_proxy(env: dict[str, str]) -> Iterator[int]:
    """``signing-proxy run --listen 127.0.0.1:0`` on the embedded defaults; yields the port of its
    "listening on http://HOST:PORT" line and stops it after (by PID)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "signing_proxy", "run", "--listen", "127.0.0.1:0"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    stderr = proc.stderr
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(stderr), name="proxy-stderr", daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("listening on" in ln for ln in lines) or proc.poll() is not None, "the proxy")
        line = next((ln for ln in lines if "listening on" in ln), None)
        assert line is not None, "".join(lines)
        yield int(line.split("listening on http://", 1)[1].split()[0].rsplit(":", 1)[1])
    finally:
        proc.terminate()
        proc.wait(WAIT_S)
        reader.join(WAIT_S)  # stderr is at its end once the process has exited
        stderr.close()


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_quick_start(tmp_path: Path, echo_origin: int) -> None:
    readme = (ROOT / "README.md").read_text()
    assert "signing-proxy run" in readme
    assert "examples/echo_origin.py" in readme
    env = {**os.environ, "HOME": str(tmp_path)}  # the default data_dir lives under ~
    with running_proxy(env) as proxy_port:
        curl_env = {**env, "http_proxy": f"http://127.0.0.1:{proxy_port}"}
        curl_env.pop("no_proxy", None)
        curl_env.pop("NO_PROXY", None)
        out = subprocess.run(
            ["curl", "-sS", f"http://127.0.0.1:{echo_origin}/hello"],
            env=curl_env,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=True,
        ).stdout
    assert 'Signature-Input: agent=("@method" "@target-uri" "content-digest" "authorization" ' in out
    assert "Signature: agent=:" in out
    assert "Content-Digest: sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:" in out
    assert list((tmp_path / ".local/share/signing-proxy/keys/default").glob("*.pem"))  # the key store
