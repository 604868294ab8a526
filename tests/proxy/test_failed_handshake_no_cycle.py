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

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.service.app import ProxyApp
from tests.harness import WAIT_S
from tests.net.test_failed_fetch_no_cycle import left_in_cycles, no_cycle_collector
from tests.proxy.raw_upstream import raw_backend

__all__ = ["no_cycle_collector"]  # the fixture, used by name

KEY = SigningKey.generate()


def answer_garbage(conn: socket.socket) -> None:
    """Reads the handshake's head, answers with bytes that are no HTTP response, closes."""
    conn.settimeout(WAIT_S)
    with conn, contextlib.suppress(OSError):
        got = b""
        while b"\r\n\r\n" not in got and (chunk := conn.recv(65536)):
            got += chunk
        conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")


async def handshake_answered_502(tmp: Path, origin_port: int) -> bytes:
    config = parse_config(
        {"listen": "127.0.0.1:0", "data_dir": str(tmp / "data"), "intercept": {"enabled": False}}
    )
    app = ProxyApp(config, StaticKeyProvider(KEY))
    [(_host, port)] = await app.start()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
        authority = f"127.0.0.1:{origin_port}"
        writer.write(
            f"GET ws://{authority}/chat HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\n"
            "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode()
        )
        answer = await asyncio.wait_for(reader.read(-1), WAIT_S)  # to the close: the handler is done
        writer.close()
        with contextlib.suppress(ConnectionError):
            await asyncio.wait_for(writer.wait_closed(), WAIT_S)
        return answer
    finally:
        await app.stop()


def test_a_failed_handshake_is_freed_without_the_cycle_collector(
    tmp_path: Path, no_cycle_collector: None
) -> None:
    with raw_backend(answer_garbage) as origin_port, asyncio.Runner() as runner:
        answer = runner.run(handshake_answered_502(tmp_path, origin_port))
        cycles = left_in_cycles()
    assert answer.startswith(b"HTTP/1.1 502 "), answer[:200]
    for held in ("switch", "ProxyHandler.serve", "UpstreamConnection", "Request"):
        assert cycles[held] == 0, (held, cycles)
