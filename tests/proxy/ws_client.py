"""A WebSocket client run as its own process (``python -m tests.proxy.ws_client URL PROXY [CAFILE]``): aiohttp
through the proxy, one text and one binary message; prints the answers as JSON. A process of its own because
aiohttp leaves the raw transport of TLS-in-TLS (wss through CONNECT) to the garbage collector."""

from __future__ import annotations

import asyncio
import json
import ssl
import sys

import aiohttp

TIMEOUT_S = 15.0


async def talk(url: str, proxy: str, cafile: str | None) -> list[str]:
    context = ssl.create_default_context(cafile=cafile) if cafile else True
    async with aiohttp.ClientSession() as session, session.ws_connect(url, proxy=proxy, ssl=context) as ws:
        await ws.send_str("hello")
        first = await asyncio.wait_for(ws.receive(), TIMEOUT_S)
        await ws.send_bytes(b"\x01\x02\x03")
        second = await asyncio.wait_for(ws.receive(), TIMEOUT_S)
        return [first.data, second.data.hex()]


if __name__ == "__main__":
    print(json.dumps(asyncio.run(talk(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))))
