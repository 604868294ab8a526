"""The answer to a WebSocket handshake, however the reads cut it: a refusal's body is kept whole up to
``REFUSAL_BODY_MAX_BYTES`` or refused as ``response-too-large``; only the head counts as head."""

from __future__ import annotations

import asyncio

import pytest

from signing_proxy.errors import ProxyError
from signing_proxy.net.websocket import REFUSAL_BODY_MAX_BYTES, _Handshake
from tests.harness import WAIT_S

MAX_HEAD = 64 * 1024
REFUSAL = b"HTTP/1.1 403 Forbidden\r\n"


def reads(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


async def answer(pieces: list[bytes], *, closed: bool = False) -> _Handshake:
    handshake = _Handshake(max_head_bytes=MAX_HEAD)
    for piece in pieces:
        handshake.data_received(piece)
    if closed:
        handshake.connection_lost(None)
    await asyncio.wait_for(handshake.done, WAIT_S)
    return handshake


@pytest.mark.parametrize("read_size", [1 << 20, 4096], ids=["one-read", "small-reads"])
async def test_a_refusal_at_the_cap_is_kept_whole(read_size: int) -> None:
    body = b"x" * REFUSAL_BODY_MAX_BYTES
    handshake = await answer(reads(REFUSAL + b"Content-Length: %d\r\n\r\n" % len(body) + body, read_size))
    assert handshake.status == 403
    assert b"".join(handshake.body) == body


@pytest.mark.parametrize("read_size", [1 << 20, 4096], ids=["one-read", "small-reads"])
@pytest.mark.parametrize("framing", ["content-length", "close-delimited"])
async def test_a_refusal_over_the_cap_is_response_too_large(read_size: int, framing: str) -> None:
    body = b"x" * (REFUSAL_BODY_MAX_BYTES + 1)
    length = b"Content-Length: %d\r\n" % len(body) if framing == "content-length" else b""
    with pytest.raises(ProxyError) as refused:
        await answer(reads(REFUSAL + length + b"\r\n" + body, read_size), closed=framing == "close-delimited")
    assert (refused.value.status, refused.value.reason) == (502, "response-too-large")


async def test_frames_in_the_same_read_as_a_101_are_kept_not_counted_as_head() -> None:
    frames = bytes(range(256)) * 512  # 128 KiB, more than a head may be
    head = (
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
    )
    handshake = await answer([head + frames])
    assert handshake.status == 101
    assert handshake.rest == frames
