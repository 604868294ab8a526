"""A raw client of the gated aiohttp listeners (admin, publication, verify-origin): whole answers
read off a stream, the end of a closed connection, many connections closed at once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import suppress

WAIT_S = 10.0

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def read_to_end(reader: asyncio.StreamReader) -> bytes:
    """What arrives until the listener closes (a reset reads as the end too)."""
    try:
        return await asyncio.wait_for(reader.read(), WAIT_S)
    except ConnectionResetError:
        return b""


async def answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One whole answer read (its body too, so the next starts clean): its head and its body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head, await asyncio.wait_for(reader.readexactly(length), WAIT_S)


async def answer_head(reader: asyncio.StreamReader) -> bytes:
    """One whole answer read; its head returned."""
    return (await answer(reader))[0]


def close_all(streams: Sequence[Streams]) -> None:
    for _, writer in streams:
        with suppress(OSError):
            writer.close()
