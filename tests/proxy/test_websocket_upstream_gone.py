"""A WebSocket handshake whose upstream connection is gone before the pipe could take it over holds
no place in ``limits.max_connections`` (a review found each such pipe counted for good, until every
client was refused ``503 too-many-connections``).

Two origins end the upstream side at once: one answers a bare ``101`` (no ``Upgrade``/``Connection``:
RFC 6455 section 4.1 makes it a failed handshake, here ``502 upstream-bad-response``), one a correct
``101`` over TLS and then a FIN or a TCP reset, without close_notify (``502 upstream-reset``, or a
pipe that ends and is logged, whichever the proxy saw first). A third, the control, resets only once
the client has its ``101``: a pipe that ends and is logged as ``event=websocket``. In each case more
handshakes than the limit are made one after the other, and a new client is served after them.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.core.jwk import SigningKey
from signing_proxy.net.leaves import LeafContextCache
from signing_proxy.storage.ca import CertificateAuthority
from tests.harness import WAIT_S, ProxyProcess, wait_for
from tests.proxy.raw_upstream import raw_backend

KEY = SigningKey.generate()
MAX_CONNECTIONS = 2
HANDSHAKES = MAX_CONNECTIONS + 2  # any place kept would refuse the last ones, and the client after
FRAME = b"\x81\x05hello"  # an unmasked text frame, as a server sends it
GOOD_101 = (  # Sec-WebSocket-Accept: the one the handshakes' key asks for (RFC 6455 section 4.1)
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
)


def read_head(conn: socket.socket) -> bytes:
    conn.settimeout(WAIT_S)
    head = b""
    while b"\r\n\r\n" not in head and (chunk := conn.recv(65536)):
        head += chunk
    return head


def reset(conn: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), and so without any TLS close_notify."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def bare_101(conn: socket.socket, _client_has_101: threading.Event) -> None:
    """A 101 without its fields and a frame, then the connection held until the proxy drops it."""
    with conn, contextlib.suppress(OSError):
        read_head(conn)
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\n\r\n" + FRAME)
        while conn.recv(65536):
            pass


def tls_ends_at_once(
    context: ssl.SSLContext, end: Callable[[socket.socket], None]
) -> Callable[[socket.socket, threading.Event], None]:
    """A correct 101 over TLS, then the connection ended by ``end`` without close_notify."""

    def serve(conn: socket.socket, _client_has_101: threading.Event) -> None:
        with contextlib.suppress(OSError):
            conn.settimeout(WAIT_S)
            tls = context.wrap_socket(conn, server_side=True)  # detaches conn: tls owns the socket
            read_head(tls)
            tls.sendall(GOOD_101)
            end(tls)
        conn.close()  # a no-op once detached; the socket when the TLS handshake failed

    return serve


def reset_once_the_client_has_its_101(conn: socket.socket, client_has_101: threading.Event) -> None:
    with contextlib.suppress(OSError):
        read_head(conn)
        conn.sendall(GOOD_101)
        client_has_101.wait(WAIT_S)
    reset(conn)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("pki")
    origin_ca = CertificateAuthority.generate()
    (tmp / "origin-ca.pem").write_bytes(origin_ca.cert_pem())
    with LeafContextCache(origin_ca, 4) as leaves:
        yield {"ca_file": tmp / "origin-ca.pem", "tls": leaves.get("127.0.0.1")}


def handshake(proxy_port: int, scheme: str, origin_port: int, client_has_101: threading.Event) -> bytes:
    """One handshake through the proxy: everything the client reads until the proxy closes."""
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=WAIT_S) as sock:
        sock.sendall(
            f"GET {scheme}://127.0.0.1:{origin_port}/ws HTTP/1.1\r\nHost: 127.0.0.1:{origin_port}\r\n"
            "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode()
        )
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                got += chunk
                if got.startswith(b"HTTP/1.1 101 ") and b"\r\n\r\n" in got:
                    client_has_101.set()
    return got


def healthz(proxy_port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=WAIT_S) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return sock.recv(65536).split(b"\r\n", 1)[0]


def log_docs(proxy: ProxyProcess) -> list[dict[str, Any]]:
    docs = []
    for line in list(proxy.stderr_lines):
        with contextlib.suppress(ValueError):
            docs.append(json.loads(line[line.index("{") :]))
    return docs


@pytest.mark.parametrize("origin", ["bare-101", "tls-fin-at-once", "tls-reset-at-once", "reset-after-101"])
def test_a_handshake_whose_upstream_is_gone_gives_its_place_back(
    origin: str, pki: dict[str, Any], tmp_path: Path
) -> None:
    serve = {
        "bare-101": bare_101,
        "tls-fin-at-once": tls_ends_at_once(pki["tls"], socket.socket.close),  # a FIN, no close_notify
        "tls-reset-at-once": tls_ends_at_once(pki["tls"], reset),
        "reset-after-101": reset_once_the_client_has_its_101,
    }[origin]
    scheme = "wss" if origin.startswith("tls") else "ws"
    config = {
        "log": {"format": "json"},
        "limits": {"max_connections": MAX_CONNECTIONS},
        "timeouts": {"client_idle_s": 2},  # a pipe left behind is cut from its client, never given back
        "upstream": {"pin_ca_files": {"127.0.0.1": str(pki["ca_file"])}},
    }
    events: list[threading.Event] = []

    def each(conn: socket.socket) -> None:
        serve(conn, events[-1])

    with raw_backend(each) as origin_port, ProxyProcess(tmp_path, config, key=KEY) as proxy:
        answers = []
        for _ in range(HANDSHAKES):
            events.append(threading.Event())
            answers.append(handshake(proxy.port, scheme, origin_port, events[-1]))
        assert healthz(proxy.port) == b"HTTP/1.1 200 OK", "places in limits.max_connections not given back"

        heads = [answer.split(b"\r\n", 1)[0] for answer in answers]
        piped = heads.count(b"HTTP/1.1 101 Switching Protocols")

        def logged() -> tuple[list[dict[str, Any]], int]:
            docs = log_docs(proxy)
            lines = [doc for doc in docs if doc.get("event") == "request" and doc["outcome"] != "local"]
            return lines, sum(doc.get("event") == "websocket" for doc in docs)

        wait_for(lambda: logged() == (logged()[0], piped), "an event=websocket line for each pipe that ran")
        wait_for(lambda: len(logged()[0]) == HANDSHAKES, "an access line for each handshake")
        ws = logged()[0]
        if origin == "bare-101":
            assert heads == [b"HTTP/1.1 502 Bad Gateway"] * HANDSHAKES
            assert all(b'"upstream-bad-response"' in answer and FRAME not in answer for answer in answers)
            assert {doc["outcome"] for doc in ws} == {"upstream-bad-response"}
        elif origin == "reset-after-101":
            assert heads == [b"HTTP/1.1 101 Switching Protocols"] * HANDSHAKES
        else:  # which came first, the reset or the proxy's next look at the connection, is the network's
            for answer, head in zip(answers, heads, strict=True):
                assert head in {b"HTTP/1.1 101 Switching Protocols", b"HTTP/1.1 502 Bad Gateway"}, answer
                assert head.endswith(b"101 Switching Protocols") or b'"upstream-reset"' in answer
            assert {doc["outcome"] for doc in ws} <= {"websocket", "upstream-reset"}
