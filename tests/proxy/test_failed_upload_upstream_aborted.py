"""An upload that failed upstream is dropped with its connection, not written out for 30 s more.

A review found a failed exchange's upstream connection closed gracefully: asyncio's close writes
out what the transport still holds, for up to 30 s (``net.outbox.CLOSE_DRAIN_S``), while the engine
had given the body's share of ``limits.max_buffered_bytes`` back at once. Uploads to a stalled
upstream so held many times that bound (12 uploads of 10 MiB every 10 s: 569 MiB). Nothing of a
failed exchange is owed to the upstream: the connection is aborted, and the unsent rest of the
body goes with it. Here the upstream reads nothing until the client has its ``504``; then it reads
to the end of the stream: the end comes, and before the body's.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from signing_proxy.core.jwk import SigningKey
from tests.harness import WAIT_S, ProxyProcess

pytestmark = pytest.mark.integration

KEY = SigningKey.generate()
BODY = b"u" * (10 * 1024 * 1024 - 1024)  # under limits.max_body_bytes (10 MiB)
ORIGIN_RCVBUF = 64 * 1024  # what the origin's kernel takes unread


class StalledOrigin:
    """Accepts one connection and reads nothing of it until ``read`` is set; then reads to its end
    (``ended``: EOF or a reset, None if WAIT_S passed first) and counts what arrived (``received``)."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, ORIGIN_RCVBUF)  # accepted ones too
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = self.listener.getsockname()[1]
        self.read = threading.Event()
        self.done = threading.Event()
        self.received = 0
        self.ended: str | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        try:
            self.listener.settimeout(WAIT_S)
            conn, _ = self.listener.accept()
        except OSError:
            self.done.set()
            return
        with conn:
            conn.settimeout(WAIT_S)
            self.read.wait(WAIT_S)
            try:
                while chunk := conn.recv(1024 * 1024):
                    self.received += len(chunk)
                self.ended = "EOF"
            except ConnectionResetError:
                self.ended = "reset"
            except OSError:
                pass  # WAIT_S without the end: ended stays None
        self.done.set()

    def __enter__(self) -> StalledOrigin:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.read.set()
        self.listener.close()
        self._thread.join(2 * WAIT_S)


@contextlib.contextmanager
def proxy_with_read_s(tmp: Path, read_s: float) -> Iterator[ProxyProcess]:
    with ProxyProcess(tmp, {"log": {"format": "json"}, "timeouts": {"read_s": read_s}}, key=KEY) as proxy:
        yield proxy


def test_the_upstream_of_a_failed_upload_is_aborted_with_the_unsent_body(tmp_path: Path) -> None:
    with StalledOrigin() as origin, proxy_with_read_s(tmp_path, 1) as proxy:
        authority = f"127.0.0.1:{origin.port}"
        head = (
            f"POST http://{authority}/upload HTTP/1.1\r\nHost: {authority}\r\n"
            f"Content-Length: {len(BODY)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as client:
            client.sendall(head + BODY)
            answer = client.recv(65536)
            assert answer.startswith(b"HTTP/1.1 504 "), answer[:200]
            assert b"upstream-timeout" in answer
            origin.read.set()  # from now on the origin reads: what the proxy still sends, to the end
            assert origin.done.wait(2 * WAIT_S)
    assert origin.ended is not None, "the proxy kept the failed exchange's connection open"
    assert origin.received < len(head) + len(BODY), "the proxy went on sending a failed upload"
