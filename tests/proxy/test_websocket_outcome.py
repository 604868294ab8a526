"""A WebSocket handshake the upstream refused is logged and counted as any request that went there.

At a gateway (which signs nothing) it was ``outcome=signed`` where an ordinary request is
``verified``, and in both modes its line had no ``profile``, though the handshake was signed (or
checked) under one like any other request.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.core.jwk import SigningKey
from tests.harness import WAIT_S, ProxyProcess
from tests.oracle import oracle_agent_sign
from tests.proxy.raw_upstream import raw_backend, websocket_handshake
from tests.proxy.test_gateway_spelling import gateway_before
from tests.verify.directory_host import served_directory

REFUSED = b"HTTP/1.1 426 Upgrade Required\r\nSec-WebSocket-Version: 13\r\nContent-Length: 0\r\n\r\n"
HANDSHAKE = [
    ("Connection", "Upgrade"),
    ("Upgrade", "websocket"),
    ("Sec-WebSocket-Version", "13"),
    ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
]


def request_lines(proxy: ProxyProcess, count: int) -> list[dict[str, Any]]:
    """The first ``count`` access-log lines (JSON), waited for."""
    deadline = time.monotonic() + WAIT_S
    while True:
        lines = [json.loads(line) for line in list(proxy.stderr_lines) if '"event":"request"' in line]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


@pytest.mark.integration
def test_an_agent_hops_refused_handshake_names_its_profile(tmp_path: Path) -> None:
    config = {"log": {"format": "json", "access_log": True}}
    with ProxyProcess(tmp_path, config) as proxy:
        got, seen = websocket_handshake(proxy.port, REFUSED, to_eof=True)
        (line,) = request_lines(proxy, 1)
    assert got.startswith(b"HTTP/1.1 426 "), got
    assert b"signature-input:" in seen.lower()
    assert (line["status"], line["outcome"], line["profile"]) == (426, "signed", "svc")


@pytest.mark.integration
def test_a_gateways_refused_handshake_is_verified_as_any_request(tmp_path: Path) -> None:
    agent = SigningKey.generate()

    def refuse(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(WAIT_S)
            head = b""
            while b"\r\n\r\n" not in head and (chunk := conn.recv(65536)):
                head += chunk
            conn.sendall(REFUSED)

    with (
        raw_backend(refuse) as backend_port,
        served_directory(agent) as base,
        ProxyProcess(tmp_path, gateway_before(backend_port, access_log=True)) as gateway,
    ):
        host = f"127.0.0.1:{gateway.port}"
        answers = []
        for path, extra in (("/ws", HANDSHAKE), ("/plain", [])):
            head = [("Host", host), *extra]
            signed = oracle_agent_sign(
                "GET", f"http://{host}{path}", b"", agent, signature_agent=base, head=head
            )
            request = f"GET {path} HTTP/1.1\r\n" + "".join(f"{n}: {v}\r\n" for n, v in signed) + "\r\n"
            with socket.create_connection(("127.0.0.1", gateway.port), timeout=WAIT_S) as sock:
                sock.sendall(request.encode("latin-1"))
                answers.append(sock.recv(65536))
        handshake, plain = request_lines(gateway, 2)
    assert all(answer.startswith(b"HTTP/1.1 426 ") for answer in answers), answers
    assert (handshake["outcome"], handshake["profile"]) == ("verified", plain["profile"])
    assert plain["outcome"] == "verified"
