"""An idempotent request is not sent upstream again once its client has gone.

When a client leaves while its request waits on a reused pooled connection, the proxy closes that
connection to stop fetching for it; the failure that follows looks like the reset a resend is for
(RFC 9110 section 9.2.2), but nobody would read the answer. A review found the request re-signed and
sent once more. The origin must see exactly the requests the client sent.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.core.jwk import SigningKey
from tests.harness import WAIT_S, ProxyProcess, wait_for
from tests.proxy.raw_upstream import raw_backend, request_line

KEY = SigningKey.generate()


def read_answer(sock: socket.socket) -> bytes:
    """One answer whose body is ``ok`` (Content-Length 2): its head and body."""
    got = b""
    while not (b"\r\n\r\n" in got and got.endswith(b"ok")) and (chunk := sock.recv(65536)):
        got += chunk
    return got


def access_lines(proxy: ProxyProcess) -> list[dict[str, Any]]:
    docs = []
    for line in list(proxy.stderr_lines):
        with contextlib.suppress(ValueError):
            docs.append(json.loads(line[line.index("{") :]))
    return [doc for doc in docs if doc.get("event") == "request" and doc.get("outcome") != "local"]


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_a_request_whose_client_left_is_not_sent_again(method: str, tmp_path: Path) -> None:
    seen: list[bytes] = []
    lock = threading.Lock()
    second_arrived = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(WAIT_S)
            while (line := request_line(conn)) is not None:
                with lock:
                    seen.append(line)
                    count = len(seen)
                if count == 2:  # the one whose client leaves: unanswered until the proxy lets go of it
                    second_arrived.set()
                    while conn.recv(65536):
                        pass
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    with raw_backend(serve) as port, ProxyProcess(tmp_path, {"log": {"format": "json"}}, key=KEY) as proxy:
        request = f"{method} http://127.0.0.1:{port}/item HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
            sock.sendall(request)
            assert read_answer(sock).startswith(b"HTTP/1.1 200 OK")  # its upstream connection is pooled
            sock.sendall(request)  # served after the first: on that pooled connection
            assert second_arrived.wait(WAIT_S), "the second request never reached the origin"
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset
        wait_for(lambda: len(access_lines(proxy)) == 2, "the access line of the request whose client left")

        assert seen == [f"{method} /item HTTP/1.1".encode()] * 2, "the origin saw a request nobody sent"
        assert access_lines(proxy)[1]["outcome"] == "aborted"
