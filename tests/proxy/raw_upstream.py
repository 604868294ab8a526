"""Raw upstreams (a listener that serves each connection on a thread; one WebSocket handshake through
the proxy), and the event loops tests run on."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.harness import WAIT_S


@contextlib.contextmanager
def raw_backend(serve: Callable[[socket.socket], None]) -> Iterator[int]:
    """A listener on 127.0.0.1 that runs ``serve`` on each connection it accepts, each on its own
    thread (``serve`` closes it); yields its port, and stops accepting when the block ends."""
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def request_line(conn: socket.socket) -> bytes | None:
    """Read one request head (no body) from ``conn``; its request line, or None when the peer closed
    or the read failed first."""
    head = b""
    while b"\r\n\r\n" not in head:
        try:
            chunk = conn.recv(65536)
        except OSError:
            return None
        if not chunk:
            return None
        head += chunk
    return head.split(b"\r\n", 1)[0]


def loop_factories() -> list[Any]:
    """asyncio's event loop, and uvloop's when it is installed (``pytest.param``s, by name)."""
    factories: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:
        return factories
    return [*factories, pytest.param(uvloop.new_event_loop, id="uvloop")]


def websocket_handshake(
    proxy_port: int, answer: bytes, *, to_eof: bool, reset: bool = False
) -> tuple[bytes, bytes]:
    """A WebSocket handshake through the proxy on ``proxy_port`` to an upstream that answers
    ``answer`` and closes (``reset``: with a TCP reset): what the client read (its head, or
    ``to_eof`` all of it), and the handshake head the upstream received."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    seen: list[bytes] = []

    def upstream() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(WAIT_S)
            head = b""
            while b"\r\n\r\n" not in head and (chunk := conn.recv(65536)):
                head += chunk
            seen.append(head)
            with contextlib.suppress(OSError):  # the proxy stops reading a refusal too large to relay
                conn.sendall(answer)
            if reset:  # SO_LINGER 0: the close sends RST, not FIN
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    server = threading.Thread(target=upstream, daemon=True)
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", proxy_port), timeout=WAIT_S) as sock:
            sock.sendall(
                f"GET http://127.0.0.1:{port}/ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode()
            )
            got = b""
            while (to_eof or b"\r\n\r\n" not in got) and (chunk := sock.recv(65536)):
                got += chunk
    finally:
        server.join(WAIT_S)
        listener.close()
    return got, seen[0] if seen else b""
