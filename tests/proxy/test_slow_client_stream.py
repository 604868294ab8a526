"""A streamed answer is timed by whoever stalls it: the upstream's silence, or the client's.

A review found a client reading a large answer at 16 KiB/s cut off after ``timeouts.read_s`` (60 s):
when the client cannot keep up the proxy pauses reading the upstream, and the upstream's read
deadline, moved only by arriving bytes, ran on. ``read_s`` is the upstream's silence, and the
proxy's own pause is no silence: while it lasts the client's ``timeouts.client_idle_s`` applies
instead, so a client that reads slowly keeps its answer and one that reads nothing is still cut
off. Its access line then says what it was sent (the status and the body bytes written), where it
said ``status=0 bytes_out=0``, and those bytes count in ``signing_proxy_response_bytes_total``.
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from signing_proxy.core.jwk import SigningKey
from tests.harness import DIRECT, WAIT_S, ProxyProcess, wait_for
from tests.proxy.raw_upstream import raw_backend, request_line

pytestmark = pytest.mark.integration

KEY = SigningKey.generate()
SIZE = 256 * 1024 * 1024  # announced; far more than the test reads
STEP_BYTES = 4096  # the slow client reads this much ...
STEP_S = 0.2  # ... this often (20 KiB/s)
SLOW_FOR_S = 4.0  # and for this long: four times the upstream's read_s


def endless(conn: socket.socket) -> None:
    """Answers one request with a head announcing SIZE bytes, then sends them for as long as the
    proxy takes them (until it closes the connection, or WAIT_S without progress)."""
    conn.settimeout(WAIT_S)
    with conn, contextlib.suppress(OSError):
        if request_line(conn) is None:
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % SIZE)
        chunk = b"y" * 65536
        for _ in range(SIZE // len(chunk)):
            conn.sendall(chunk)


@contextlib.contextmanager
def asking(proxy: ProxyProcess, origin_port: int) -> Iterator[socket.socket]:
    """A client that sent a GET for the endless answer, with a small receive buffer; reset after."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window it offers
    try:
        sock.settimeout(WAIT_S)
        sock.connect(("127.0.0.1", proxy.port))
        authority = f"127.0.0.1:{origin_port}"
        sock.sendall(f"GET http://{authority}/big HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        yield sock
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


def forwarded(proxy: ProxyProcess) -> list[dict[str, Any]]:
    """The access lines of the forwarded GETs (the proxy's own /metrics is ``local``)."""
    return [doc for doc in proxy.access_lines() if doc.get("method") == "GET" and doc["outcome"] != "local"]


def response_bytes_total(proxy: ProxyProcess) -> float:
    metrics = requests.get(f"{proxy.url}/metrics", timeout=WAIT_S, proxies=DIRECT).text
    found = re.search(r"^signing_proxy_response_bytes_total (\S+)$", metrics, re.MULTILINE)
    assert found is not None, metrics
    return float(found.group(1))


def test_a_client_reading_slowly_is_not_cut_off_by_the_upstreams_read_timeout(tmp_path: Path) -> None:
    config = {"log": {"format": "json"}, "timeouts": {"read_s": 1}}
    with raw_backend(endless) as origin_port, ProxyProcess(tmp_path, config, key=KEY) as proxy:
        with asking(proxy, origin_port) as sock:
            got = b""
            ended = None
            started = time.monotonic()
            while time.monotonic() - started < SLOW_FOR_S:  # the client's pace, not a wait for the proxy
                try:
                    chunk = sock.recv(STEP_BYTES)
                except OSError as exc:
                    ended = repr(exc)
                    break
                if not chunk:
                    ended = "EOF"
                    break
                got += chunk
                time.sleep(STEP_S)
            assert ended is None, f"cut off after {len(got)} bytes: {ended}"
            assert got.startswith(b"HTTP/1.1 200 OK\r\n")
            assert forwarded(proxy) == [], "the proxy gave the answer up while the client was reading it"
        # the client reset: the stream is aborted, and its line says what it was sent
        wait_for(lambda: bool(forwarded(proxy)), "the access line of the stream the client left")
        (line,) = forwarded(proxy)
        body_read = len(got) - got.index(b"\r\n\r\n") - 4
        assert line["outcome"] == "aborted"
        assert line["status"] == 200
        assert line["bytes_out"] >= body_read > 0
        assert response_bytes_total(proxy) >= line["bytes_out"]


def test_a_client_that_reads_nothing_is_cut_off_after_client_idle_s(tmp_path: Path) -> None:
    """The upstream's read_s (60 s) no longer cuts a client that reads nothing: client_idle_s does."""
    config = {"log": {"format": "json"}, "timeouts": {"read_s": 60, "client_idle_s": 1}}
    with raw_backend(endless) as origin_port, ProxyProcess(tmp_path, config, key=KEY) as proxy:
        with asking(proxy, origin_port):
            wait_for(lambda: bool(forwarded(proxy)), "the access line of a client that reads nothing")
        (line,) = forwarded(proxy)
        assert line["outcome"] == "aborted"
        assert line["status"] == 200
        assert line["bytes_out"] > 0  # what filled the buffers before the proxy stopped reading
        assert response_bytes_total(proxy) >= line["bytes_out"]


def test_the_origin_is_let_go_with_the_client_that_read_nothing(tmp_path: Path) -> None:
    """Cutting the client off closes its upstream too: the origin's sending ends, not at WAIT_S."""
    finished = threading.Event()

    def serve(conn: socket.socket) -> None:
        try:
            endless(conn)
        finally:
            finished.set()

    config = {"timeouts": {"read_s": 60, "client_idle_s": 1}}
    with (
        raw_backend(serve) as origin_port,
        ProxyProcess(tmp_path, config, key=KEY) as proxy,
        asking(proxy, origin_port),
    ):
        assert finished.wait(WAIT_S), "the proxy kept the origin's connection open"
