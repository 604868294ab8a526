"""limits.max_connections counts every client connection the proxy holds open: served ones, and those
a WebSocket pipe or a blind tunnel took over (they left the engine's set when they were taken over,
so any client could hold any number of sockets open through pipes to a server of its own), and an
intercepted CONNECT still waiting for its TLS handshake."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.service.app import ProxyApp
from tests.harness import WAIT_S, until

LIMIT = 2
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def upgrading(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An origin that accepts every WebSocket handshake and then holds the pipe open."""
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"  # the handshake's key's
        )
        await reader.read()
    writer.close()


async def holding(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A TCP server that holds each connection open until its peer closes."""
    with contextlib.suppress(ConnectionError):
        await reader.read()
    writer.close()


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    websocket_origin = await asyncio.start_server(upgrading, "127.0.0.1", 0)
    tcp_origin = await asyncio.start_server(holding, "127.0.0.1", 0)
    ws_port = websocket_origin.sockets[0].getsockname()[1]
    tcp_port = tcp_origin.sockets[0].getsockname()[1]
    config = parse_config(
        {
            "listen": "127.0.0.1:0",
            "data_dir": str(tmp_path),
            "intercept": {"enabled": True, "tunnel": ["127.0.0.1"], "allowed_ports": [tcp_port]},
            "log": {"access_log": False},
            "limits": {"max_connections": LIMIT},
        }
    )
    app = ProxyApp(config, StaticKeyProvider(SigningKey.generate()))
    [(_host, port)] = await app.start()
    try:
        yield {"app": app, "port": port, "ws_port": ws_port, "tcp_port": tcp_port}
    finally:
        await app.stop(drain_s=0)
        websocket_origin.close()
        tcp_origin.close()


async def first_line(port: int, request: bytes) -> tuple[bytes, Streams]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
    writer.write(request)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n"), WAIT_S)
    return head.rstrip(), (reader, writer)


def handshake(ws_port: int) -> bytes:
    return (
        b"GET ws://127.0.0.1:%d/chat HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n" % ws_port
    )


def connect(tcp_port: int, host: bytes = b"127.0.0.1") -> bytes:
    return b"CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (host, tcp_port, host, tcp_port)


@pytest.mark.parametrize("kind", ["websocket", "tunnel", "interception"])
async def test_pipes_and_tunnels_count_against_max_connections(world: dict[str, Any], kind: str) -> None:
    """``interception``: a CONNECT the proxy will intercept, whose client never starts its TLS
    handshake: the connection waits for a ClientHello, and still holds its place."""
    app, port = world["app"], world["port"]
    request = {
        "websocket": handshake(world["ws_port"]),
        "tunnel": connect(world["tcp_port"]),
        "interception": connect(world["tcp_port"], host=b"localhost"),
    }[kind]
    wanted = (
        b"HTTP/1.1 101 Switching Protocols" if kind == "websocket" else b"HTTP/1.1 200 Connection Established"
    )
    held: list[Streams] = []
    try:
        for _ in range(LIMIT):
            line, streams = await first_line(port, request)
            held.append(streams)
            assert line == wanted
        await until(lambda: app.engine.open_count() == LIMIT)
        refused, streams = await first_line(port, request)
        held.append(streams)
        assert refused == b"HTTP/1.1 503 Service Unavailable"
        held[0][1].close()  # one pipe ends: its place is free again
        await until(lambda: app.engine.open_count() < LIMIT)
        again, streams = await first_line(port, request)
        held.append(streams)
        assert again == wanted
    finally:
        for _reader, writer in held:
            writer.close()
