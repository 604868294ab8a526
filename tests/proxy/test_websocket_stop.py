"""SIGTERM closes the WebSocket pipes still open, and each is logged (``event=websocket``: duration,
bytes) before the log writer closes: blind tunnels were, pipes were left open and their line lost."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from signing_proxy.core.jwk import SigningKey
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin

pytestmark = pytest.mark.integration

KEY = SigningKey.from_seed(b"\x55" * 32)


async def quiet(request: web.Request) -> web.StreamResponse:
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    async for _message in ws:
        pass
    return ws


@pytest.fixture
def origin() -> Iterator[VerifyingOrigin]:
    with VerifyingOrigin(handler=quiet) as server:
        server.trust(KEY)
        yield server


def test_sigterm_closes_an_open_websocket_pipe_and_logs_it(tmp_path: Path, origin: VerifyingOrigin) -> None:
    with ProxyProcess(tmp_path, {"log": {"format": "json"}}, key=KEY) as proxy:
        assert proxy.proc is not None
        target = origin.url("/ws").removeprefix("http://")
        key = base64.b64encode(os.urandom(16)).decode()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
            sock.sendall(
                (
                    f"GET http://{target} HTTP/1.1\r\nHost: {target.split('/')[0]}\r\nUpgrade: websocket\r\n"
                    f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                ).encode()
            )
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(4096)
            assert head.startswith(b"HTTP/1.1 101 "), head
            proxy.proc.send_signal(signal.SIGTERM)
            assert proxy.proc.wait(WAIT_S) == 0
            rest = b""
            while chunk := sock.recv(4096):  # the pipe is closed: the client sees its end
                rest += chunk
        assert proxy._reader is not None
        proxy._reader.join(WAIT_S)
    events = [json.loads(line) for line in proxy.stderr_lines if line.startswith("{") and '"event"' in line]
    (piped,) = [e for e in events if e.get("event") == "websocket"]
    assert piped["outcome"].startswith("websocket-")
