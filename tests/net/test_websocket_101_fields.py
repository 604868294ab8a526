"""RFC 6455 section 4.1: a ``101`` that lacks ``Upgrade: websocket`` or ``upgrade`` among its
``Connection`` tokens fails the handshake (here ``502 upstream-bad-response``), however the reads cut
it; a correct one keeps every byte that came after its head for the client, in order."""

from __future__ import annotations

import asyncio

import pytest

from signing_proxy.errors import ProxyError
from signing_proxy.net.websocket import _Handshake
from tests.harness import WAIT_S

FRAMES = b"\x81\x05hello\x82\x03\x01\x02\x03"
STATUS = b"HTTP/1.1 101 Switching Protocols\r\n"


def reads(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


async def answer(pieces: list[bytes]) -> _Handshake:
    handshake = _Handshake(max_head_bytes=64 * 1024)
    for piece in pieces:
        handshake.data_received(piece)
    await asyncio.wait_for(handshake.done, WAIT_S)
    return handshake


@pytest.mark.parametrize("read_size", [1 << 16, 1], ids=["one-read", "byte-by-byte"])
@pytest.mark.parametrize(
    "fields",
    [
        b"",  # a bare 101: llhttp pauses on it with a plain parser error, not an upgrade
        b"Connection: Upgrade\r\n",
        b"Upgrade: websocket\r\n",
        b"Upgrade: h2c\r\nConnection: Upgrade\r\n",
        b"Upgrade: websocket, h2c\r\nConnection: Upgrade\r\n",
        b"Upgrade: websocket\r\nConnection: keep-alive\r\n",
        b"Upgrade:\r\nConnection: Upgrade\r\n",
    ],
    ids=["bare", "no-upgrade", "no-connection", "h2c", "two-protocols", "not-named", "empty-upgrade"],
)
async def test_a_101_without_its_websocket_fields_is_upstream_bad_response(
    fields: bytes, read_size: int
) -> None:
    handshake = _Handshake(max_head_bytes=64 * 1024)
    for piece in reads(STATUS + fields + b"\r\n" + FRAMES, read_size):
        handshake.data_received(piece)
    with pytest.raises(ProxyError) as refused:
        await asyncio.wait_for(handshake.done, WAIT_S)
    assert (refused.value.status, refused.value.reason) == (502, "upstream-bad-response")
    assert "RFC 6455" in refused.value.detail


@pytest.mark.parametrize("read_size", [1 << 16, 7, 1], ids=["one-read", "small-reads", "byte-by-byte"])
@pytest.mark.parametrize(
    "fields",
    [
        b"Upgrade: websocket\r\nConnection: Upgrade\r\n",
        b"upgrade: WebSocket\r\nconnection: keep-alive, UPGRADE\r\n",
        b"Connection: keep-alive\r\nConnection: upgrade\r\nUpgrade: websocket\r\n",
    ],
    ids=["plain", "cases-and-lists", "repeated-connection"],
)
async def test_a_101_with_its_fields_keeps_what_followed_its_head(fields: bytes, read_size: int) -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"  # an interim answer before it changes nothing
    handshake = await answer(reads(interim + STATUS + fields + b"\r\n" + FRAMES, read_size))
    assert handshake.status == 101
    assert handshake.rest == FRAMES
