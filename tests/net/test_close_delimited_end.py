"""A response without Content-Length or chunked coding ends at the close, but only at a clean one.

RFC 9112 section 6.3 rule 8 ends such a body when the upstream closes; section 8 makes one cut by a
reset incomplete, and section 9.8 one over TLS that ends without close_notify (a FIN anyone on the
path can forge). The upstream here sends a head and half a body, waits until the proxy has passed
the half on, then ends the connection each way. A clean end completes the response; any other
fails it as ``upstream-reset``, so that the client is cut off without the final chunk and a
truncated download never looks whole. Both event loops: they report a bare FIN under TLS
differently (asyncio calls ``eof_received``, uvloop does not).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.config import UpstreamConfig, parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.core.uri import Target
from signing_proxy.errors import ProxyError
from signing_proxy.net.leaves import LeafContextCache
from signing_proxy.net.upstream import ResponseHead, UpstreamPool
from signing_proxy.service.app import ProxyApp
from signing_proxy.storage.ca import CertificateAuthority
from tests.harness import WAIT_S
from tests.proxy.raw_upstream import loop_factories, raw_backend, request_line

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
HALF = b"FIRST-HALF;"
KEY = SigningKey.generate()


class Recorder:
    """A ``ResponseSink`` that keeps what it is told; ``relayed`` is set once body bytes arrived."""

    def __init__(self) -> None:
        self.body = b""
        self.relayed = threading.Event()  # the upstream thread waits on it before it ends the stream
        self.done: asyncio.Future[ProxyError | None] = asyncio.get_running_loop().create_future()

    def on_head(self, head: ResponseHead) -> None:
        assert head.content_length is None

    def on_body(self, data: bytes) -> None:
        self.body += data
        self.relayed.set()

    def on_feed_end(self) -> None:
        pass

    def on_complete(self) -> None:
        self.done.set_result(None)

    def on_fail(self, error: ProxyError) -> None:
        self.done.set_result(error)


def _end(sock: socket.socket, how: str) -> None:
    """End a plain TCP stream: a FIN once the peer has closed too, or a reset (no linger)."""
    if how == "rst":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    else:
        sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            while sock.recv(65536):  # to the proxy's own close (bounded by the socket's timeout)
                pass
    sock.close()


def upstream(
    how: str, tls: ssl.SSLContext | None, relayed: Callable[[], threading.Event]
) -> Callable[..., None]:
    """Serves one request: head, half a body, then (once it was relayed) ends the stream ``how``."""

    def serve(conn: socket.socket) -> None:
        conn.settimeout(WAIT_S)
        stream: socket.socket = conn
        try:
            if tls is not None:
                stream = tls.wrap_socket(conn, server_side=True)
            if request_line(stream) is None:
                return
            stream.sendall(HEAD + HALF)
            relayed().wait(WAIT_S)
            if isinstance(stream, ssl.SSLSocket):
                if how == "close_notify":
                    with contextlib.suppress(OSError):
                        stream.unwrap()  # sends close_notify, then reads the proxy's
                    stream.close()
                    return
                stream = socket.socket(fileno=stream.detach())  # the TCP stream, no TLS alert on it
            _end(stream, how)
        except OSError:
            pass
        finally:
            stream.close()  # the one still held (after a reset or a FIN, already closed: a no-op)

    return serve


@pytest.fixture(scope="module")
def tls_origin(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, str]:
    """A server context for 127.0.0.1 and the path of its CA (pinned for 127.0.0.1 by the pool)."""
    authority = CertificateAuthority.generate()
    path = tmp_path_factory.mktemp("origin") / "ca.pem"
    path.write_bytes(authority.cert_pem())
    with LeafContextCache(authority, 1) as leaves:  # the context keeps its certificate once loaded
        return leaves.get("127.0.0.1"), str(path)


async def exchange(how: str, tls: tuple[ssl.SSLContext, str] | None) -> tuple[ProxyError | None, bytes]:
    recorder = Recorder()
    pins = {"127.0.0.1": tls[1]} if tls is not None else {}
    pool = UpstreamPool(UpstreamConfig(pin_ca_files=pins), connect_timeout_s=WAIT_S, read_timeout_s=WAIT_S)
    with raw_backend(upstream(how, tls[0] if tls else None, lambda: recorder.relayed)) as port:
        target = Target("https" if tls else "http", "127.0.0.1", port, "/")
        conn = await pool.connect(target)
        try:
            conn.start(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"", recorder, head_only=False)
            outcome = await asyncio.wait_for(recorder.done, WAIT_S)
        finally:
            conn.close()
            pool.close()
    return outcome, recorder.body


CASES = [
    ("plain", "fin", True),
    ("plain", "rst", False),
    ("tls", "close_notify", True),
    ("tls", "fin", False),  # RFC 9112 section 9.8: complete only if a valid closure alert arrived
    ("tls", "rst", False),
]


@pytest.mark.parametrize(("scheme", "how", "whole"), CASES)
@pytest.mark.parametrize("loop_factory", loop_factories())
def test_a_close_delimited_body_completes_only_at_a_clean_close(
    loop_factory: Any, scheme: str, how: str, whole: bool, tls_origin: tuple[ssl.SSLContext, str]
) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        outcome, body = runner.run(exchange(how, tls_origin if scheme == "tls" else None))
    assert body == HALF
    if whole:
        assert outcome is None
    else:
        assert outcome is not None, f"a close-delimited body cut by {how} ({scheme}) was completed"
        assert (outcome.status, outcome.reason) == (502, "upstream-reset")


async def through_the_proxy(tmp: Path, how: str) -> bytes:
    relayed = threading.Event()
    with raw_backend(upstream(how, None, lambda: relayed)) as origin_port:
        config = parse_config(
            {"listen": "127.0.0.1:0", "data_dir": str(tmp / "data"), "intercept": {"enabled": False}}
        )
        app = ProxyApp(config, StaticKeyProvider(KEY))
        [(_host, port)] = await app.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            url = f"http://127.0.0.1:{origin_port}/"
            writer.write(f"GET {url} HTTP/1.1\r\nHost: 127.0.0.1:{origin_port}\r\n\r\n".encode())
            got = await asyncio.wait_for(reader.readuntil(HALF + b"\r\n"), WAIT_S)
            relayed.set()  # the client has the first half: now the upstream ends its stream
            with contextlib.suppress(ConnectionResetError):  # to the final chunk, or the proxy's close
                while not got.endswith(b"\r\n0\r\n\r\n") and (
                    more := await asyncio.wait_for(reader.read(65536), WAIT_S)
                ):
                    got += more
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        finally:
            await app.stop()
    return got


@pytest.mark.parametrize(("how", "whole"), [("fin", True), ("rst", False)])
def test_the_client_gets_the_final_chunk_only_after_a_clean_close(
    tmp_path: Path, how: str, whole: bool
) -> None:
    got = asyncio.run(through_the_proxy(tmp_path, how))
    assert got.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"transfer-encoding: chunked" in got.lower()
    assert got.endswith(b"0\r\n\r\n") is whole, got
