"""A blind tunnel whose upstream hangs up while it is still being connected holds no slot.

The upstream accepts and closes at once (FIN, or a reset); the connection is made to look as if
that close arrived before ``open_upstream`` had returned (the race a review found: the tunnel
finished before it was counted, then was counted and joined to the client for good). The CONNECT
is a 502 ``upstream-reset``, the slots are given back and a new client is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.net.dial import open_upstream
from signing_proxy.proxy.accesslog import AccessLog
from signing_proxy.service.app import ProxyApp
from tests.harness import WAIT_S
from tests.proxy.raw_upstream import loop_factories

KEY = SigningKey.generate()
MAX_CONNECTIONS = 3


async def _until(condition: Callable[[], bool], step_s: float = 0.01) -> None:
    """Bounded polling of a state we cannot subscribe to; the caller asserts it afterwards."""
    for _ in range(int(WAIT_S / step_s)):
        if condition():
            return
        await asyncio.sleep(step_s)


async def _read_all(reader: asyncio.StreamReader, limit_s: float) -> bytes:
    """To EOF, or what came within ``limit_s`` (a client left open: the slot checks say why)."""
    chunks: list[bytes] = []
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    with contextlib.suppress(TimeoutError, ConnectionResetError):
        while chunk := await asyncio.wait_for(reader.read(65536), max(0.0, end - loop.time())):
            chunks.append(chunk)
    return b"".join(chunks)


async def _exchange(port: int, authority: str, then: bytes = b"", limit_s: float = WAIT_S) -> bytes:
    """CONNECT ``authority``, send ``then`` and half-close; everything the client reads to EOF."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    if then:
        writer.write(then)
        writer.write_eof()
    got = head + await _read_all(reader, limit_s)
    writer.close()
    await asyncio.sleep(0)
    return got


async def _scenario(tmp: Path, how: str, monkeypatch: pytest.MonkeyPatch, events: list[str]) -> None:
    async def hang_up(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if how == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        else:
            writer.close()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"echo:" + await reader.read())
        await writer.drain()
        writer.close()

    closing = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    echoing = await asyncio.start_server(echo, "127.0.0.1", 0)
    closing_port = closing.sockets[0].getsockname()[1]
    echo_port = echoing.sockets[0].getsockname()[1]

    async def slow_to_return(factory: Any, host: str, port: int, **options: Any) -> Any:
        end = await open_upstream(factory, host, port, **options)
        if port == closing_port:  # the upstream's close arrives before we are back in _blind
            await _until(lambda: bool(end.lost))
            assert end.lost
        return end

    monkeypatch.setattr("signing_proxy.proxy.connect.open_upstream", slow_to_return)
    config = parse_config(
        {
            "listen": "127.0.0.1:0",
            "data_dir": str(tmp / "data"),
            "limits": {"max_connections": MAX_CONNECTIONS},
            "timeouts": {"client_idle_s": 60},  # a leaked tunnel is not cleaned up by the idle timer here
            "intercept": {"allowed_ports": [closing_port, echo_port], "tunnel": ["localhost"]},
        }
    )
    app = ProxyApp(config, StaticKeyProvider(KEY))
    [(_host, port)] = await app.start()
    try:
        hung_up = f"localhost:{closing_port}"
        answers = [await _exchange(port, hung_up, limit_s=1.0) for _ in range(MAX_CONNECTIONS)]
        await _until(lambda: app.engine.open_count() == 0)
        held = (app.engine.open_count(), app.interception.taken_over())
        assert held == (0, 0), "slots (engine.open_count(), taken_over()) not given back"
        for answer in answers:
            assert answer.startswith(b"HTTP/1.1 502 "), answer[:200]
            assert b'"upstream-reset"' in answer
        assert events == []  # no tunnel ever opened: each CONNECT's own line is its record

        served = await _exchange(port, f"localhost:{echo_port}", then=b"ping")
        assert served.startswith(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        assert served.endswith(b"echo:ping")
        await _until(lambda: app.engine.open_count() == 0 and events == ["tunnel"])
        assert app.engine.open_count() == 0
        assert events == ["tunnel"]  # the tunnel that opened is logged, once
    finally:
        await app.stop()
        closing.close()
        echoing.close()


@pytest.mark.parametrize("how", ["fin", "reset"])
@pytest.mark.parametrize("loop_factory", loop_factories())
def test_an_upstream_that_hangs_up_before_the_tunnel_opens_is_502_and_holds_no_slot(
    loop_factory: Any, how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    log_event = AccessLog.event

    def spy(self: AccessLog, event: str, **fields: object) -> None:
        events.append(event)
        log_event(self, event, **fields)

    monkeypatch.setattr(AccessLog, "event", spy)
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_scenario(tmp_path, how, monkeypatch, events))
