"""A pipe whose one side ends while the other cannot half-close (TLS has no half-close) closes that
other side, once what it was sent is written, instead of leaving both open until ``client_idle_s``.

A review found the end swallowed: a WebSocket inside an intercepted CONNECT (TLS to the client) to a
plain next hop that sent its Close frame and its FIN left the client waiting, its socket and the
upstream's held, for the whole idle timeout. Here the idle timeout is far longer than the wait.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import WAIT_S, ProxyProcess
from tests.proxy.raw_upstream import raw_backend

pytestmark = pytest.mark.integration

CLIENT_IDLE_S = 30  # the pipe's idle timeout: what the client would have waited
END_WITHIN_S = 5.0  # the client sees the end well before it
INTERCEPTED_PORT = 4443
WS_KEY = "dGhlIHNhbXBsZSBub25jZQ=="
CLOSE_FRAME = b"\x88\x02\x03\xe8"  # an unmasked Close, 1000: as a server sends it


def accept(key: str) -> str:
    digest = hashlib.sha1(key.encode() + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11", usedforsecurity=False)
    return base64.b64encode(digest.digest()).decode()


class NextHop:
    """Answers the handshake with a correct 101; once the client has it, sends a Close frame and a FIN
    (shutdown for writing), then reads until the proxy closes its side too."""

    def __init__(self) -> None:
        self.client_has_101 = threading.Event()
        self.closed_by_proxy = threading.Event()

    def serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(WAIT_S * 3)
            head = b""
            while b"\r\n\r\n" not in head and (chunk := conn.recv(65536)):
                head += chunk
            conn.sendall(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                + f"Sec-WebSocket-Accept: {accept(WS_KEY)}\r\n\r\n".encode()
            )
            if not self.client_has_101.wait(WAIT_S):
                return
            conn.sendall(CLOSE_FRAME)
            conn.shutdown(socket.SHUT_WR)
            while conn.recv(65536):
                pass
            self.closed_by_proxy.set()


@pytest.fixture
def next_hop() -> Iterator[tuple[NextHop, int]]:
    hop = NextHop()
    with raw_backend(hop.serve) as port:
        yield hop, port


def test_a_plain_upstreams_end_closes_the_tls_client_side_of_the_pipe(
    tmp_path: Path, next_hop: tuple[NextHop, int]
) -> None:
    hop, port = next_hop
    config = {
        "log": {"format": "json"},
        "upstream": {"next_hop": f"http://127.0.0.1:{port}"},
        "intercept": {"allowed_ports": [INTERCEPTED_PORT]},
        "timeouts": {"client_idle_s": CLIENT_IDLE_S},
    }
    with ProxyProcess(tmp_path, config) as agent:
        context = ssl.create_default_context(cafile=str(agent.tmp / "data" / "ca.pem"))
        with socket.create_connection(("127.0.0.1", agent.port), timeout=WAIT_S) as raw:
            authority = f"127.0.0.1:{INTERCEPTED_PORT}"
            raw.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
            established = b""
            while b"\r\n\r\n" not in established and (chunk := raw.recv(65536)):
                established += chunk
            assert established.startswith(b"HTTP/1.1 200 "), established
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(
                    (
                        f"GET /ws HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\n"
                        f"Upgrade: websocket\r\nSec-WebSocket-Key: {WS_KEY}\r\n"
                        "Sec-WebSocket-Version: 13\r\n\r\n"
                    ).encode()
                )
                got = b""
                while b"\r\n\r\n" not in got and (chunk := tls.recv(65536)):
                    got += chunk
                assert got.startswith(b"HTTP/1.1 101 "), got
                hop.client_has_101.set()
                tls.settimeout(END_WITHIN_S)
                ended = False
                with contextlib.suppress(TimeoutError):  # ended stays False
                    while chunk := tls.recv(65536):
                        got += chunk
                    ended = True
        assert got.endswith(CLOSE_FRAME), got  # what the upstream sent before its end was written first
        assert ended, f"the client saw no end within {END_WITHIN_S} s (client_idle_s {CLIENT_IDLE_S})"
        assert hop.closed_by_proxy.wait(WAIT_S), "the proxy kept the upstream's side open"
