"""A WebSocket handshake the upstream answered badly leaves nothing for the cycle collector.

As ``forward`` did (``test_failed_forward_no_cycle``): the handshake's future held the
``ProxyError``, whose traceback held ``switch``'s frame (and ``asyncio.wait_for``'s, which holds the
shielded future), and ``switch``'s frame held the handshake: the request and both connections
waited for a full collection of the cycle collector.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

from tests.harness import WAIT_S
from tests.memory import left_in_cycles
from tests.proxy.raw_upstream import raw_backend
from tests.proxy.test_failed_forward_no_cycle import answered


def answer_garbage(conn: socket.socket) -> None:
    """Reads the handshake's head, answers with bytes that are no HTTP response, closes."""
    conn.settimeout(WAIT_S)
    with conn, contextlib.suppress(OSError):
        got = b""
        while b"\r\n\r\n" not in got and (chunk := conn.recv(65536)):
            got += chunk
        conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")


async def handshake_answered_502(tmp: Path, origin_port: int) -> bytes:
    authority = f"127.0.0.1:{origin_port}"
    return await answered(
        tmp,
        f"GET ws://{authority}/chat HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\n"
        "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode(),
    )


def test_a_failed_handshake_is_freed_without_the_cycle_collector(
    tmp_path: Path, no_cycle_collector: None
) -> None:
    with raw_backend(answer_garbage) as origin_port, asyncio.Runner() as runner:
        answer = runner.run(handshake_answered_502(tmp_path, origin_port))
        cycles = left_in_cycles()
    assert answer.startswith(b"HTTP/1.1 502 "), answer[:200]
    for held in ("switch", "ProxyHandler.serve", "UpstreamConnection", "Request"):
        assert cycles[held] == 0, (held, cycles)
