"""``signing-proxy gateway``: starts in mode gateway from flags alone, refuses what is unsigned before
the backend sees it, and refuses a configuration without a usable backend (exit 2)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from signing_proxy.cli.common import config_from
from signing_proxy.cli.main import build_parser
from tests.harness import WAIT_S, run_cli
from tests.proxy.gateway_backend import Backend

pytestmark = pytest.mark.integration


def test_gateway_from_flags_refuses_an_unsigned_request(tmp_path: Path) -> None:
    with Backend() as backend:
        proc = subprocess.Popen(
            [sys.executable, "-m", "signing_proxy", "gateway", "--upstream", backend.url,
             "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data")],
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            assert proc.stderr is not None
            line = ""
            for line in proc.stderr:
                if "listening on" in line:
                    break
            url = line.split("listening on ", 1)[1].split()[0]
            resp = requests.post(url + "/v1/x", data=b"{}", proxies={"http": ""}, timeout=WAIT_S)
            assert resp.status_code == 401
            assert resp.json()["reason"] == "missing-signature"
            host, port = url.removeprefix("http://").rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
                sock.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
                head = sock.recv(4096)
            assert head.startswith(b"HTTP/1.1 405 "), head  # a gateway is not a forward proxy
            assert b"connect-not-supported" in head
            assert backend.arrivals == []
            ready = requests.get(url + "/readyz", proxies={"http": ""}, timeout=WAIT_S)
            assert ready.status_code == 200, ready.text
            assert "signing_key" not in ready.json()["checks"]  # a gateway signs nothing
            # a gateway signs nothing: its line says what it is and what it is in front of, no keyid
            assert f"gateway listening on {url} -> upstream {backend.url}" in line
            assert "keyid" not in line
            assert not list((tmp_path / "data").rglob("*.pem"))  # and keeps no key store
        finally:
            proc.terminate()
            proc.wait(WAIT_S)
            if proc.stderr is not None:
                proc.stderr.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "gateway.upstream"),
        (("--upstream", "http://127.0.0.1:9/api"), "an origin only"),
        (("--upstream", "ftp://x"), "gateway.upstream"),
    ],
)
def test_gateway_without_a_usable_backend_exits_2(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    done = run_cli("gateway", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d"), *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


def test_host_flags_set_the_names_the_gateway_answers_for(tmp_path: Path) -> None:
    """A gateway on 0.0.0.0 answers 421 for any Host but the loopback names until it is told its own."""
    upstream = ["gateway", "--upstream", "http://127.0.0.1:9000", "--data-dir", str(tmp_path)]
    named = config_from(build_parser().parse_args([*upstream, "--host", "gw.example", "--host", "10.0.0.7"]))
    assert named.gateway.hosts == ("gw.example", "10.0.0.7")
    assert config_from(build_parser().parse_args(upstream)).gateway.hosts == (
        "localhost",
        "127.0.0.1",
        "[::1]",
    )
    refused = run_cli(*upstream, "--host", "gw.example:8080", "--listen", "127.0.0.1:0")
    assert refused.returncode == 2
    assert "gateway.hosts[0]: a host name or address without a port" in refused.stderr
