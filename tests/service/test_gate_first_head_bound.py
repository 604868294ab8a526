"""The accept gate's first-head timers stay bounded by its connection cap however fast strangers
open and drop connections: each timer held its transport and handler for ``idle_s`` after the
client had gone (14,800 held after a few seconds of churn against a cap of 256)."""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

from signing_proxy.service.gate import Gate, start_gated

CAP = 16
CHURN = 400  # connections opened and dropped at once, each before its head


async def test_connections_dropped_before_their_head_do_not_pile_up() -> None:
    app = web.Application()
    gate = Gate(max_connections=CAP, idle_s=60.0)  # far longer than the test: only a sweep drops them
    runner = await start_gated(app, gate, "127.0.0.1", 0, reuse_port=False)
    port = runner.addresses[0][1]
    try:
        for _ in range(CHURN):
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10.0)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            writer.close()  # a reset: the listener sees the connection lost at once
            await asyncio.sleep(0)  # the listener accepts it, then hears it go
        await asyncio.sleep(0.2)
        assert len(gate.first_head) <= CAP
    finally:
        await runner.cleanup()
