"""A blind tunnel that takes over an upstream connection another protocol opened (a WebSocket
handshake's) finishes even when that connection had already ended there: its end is counted when the
client joins, the client is closed (nothing will answer it) and ``on_finished`` runs once it has gone.
A review found such a pipe waiting for good for an end it would never hear of, counted in
``limits.max_connections`` until a restart."""

from __future__ import annotations

import asyncio
import contextlib
import typing
from typing import Any

import pytest

from signing_proxy.net.tunnel import BlindTunnel
from tests.harness import WAIT_S
from tests.proxy.raw_upstream import loop_factories


class _First(asyncio.Protocol):
    """The protocol a connection has before the tunnel takes it over (or the proxy's accepted side)."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.made: asyncio.Future[asyncio.Transport] = loop.create_future()
        self.lost: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made.set_result(typing.cast(asyncio.Transport, transport))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


async def _hang_up(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


async def _eof_within(reader: asyncio.StreamReader, limit_s: float) -> bool:
    with contextlib.suppress(TimeoutError, ConnectionError):
        return await asyncio.wait_for(reader.read(), limit_s) == b""
    return False


async def _scenario(when: str) -> None:
    loop = asyncio.get_running_loop()
    origin = await asyncio.start_server(_hang_up, "127.0.0.1", 0)
    accepted = _First()
    front = await loop.create_server(lambda: accepted, "127.0.0.1", 0)
    finished: list[BlindTunnel] = []
    all_done: asyncio.Future[None] = loop.create_future()

    def on_finished(tunnel: BlindTunnel) -> None:
        finished.append(tunnel)
        if not all_done.done():
            all_done.set_result(None)

    writer: asyncio.StreamWriter | None = None
    try:
        first = _First()
        await loop.create_connection(lambda: first, "127.0.0.1", origin.sockets[0].getsockname()[1])
        upstream = await asyncio.wait_for(first.made, WAIT_S)
        if when == "told-elsewhere":  # its connection_lost went to the protocol it had then
            await asyncio.wait_for(first.lost, WAIT_S)
        else:  # "closing": its connection_lost is on its way, to whichever protocol it has by then
            upstream.close()
        tunnel = BlindTunnel("127.0.0.1", "origin", on_finished, idle_s=WAIT_S * 4)  # never the idle timer
        upstream.set_protocol(tunnel.upstream)  # taken over, as net.websocket.switch does
        tunnel.upstream.connection_made(upstream)

        reader, writer = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])
        tunnel.attach_client(await asyncio.wait_for(accepted.made, WAIT_S), b"early frames")
        closed_for_us = await _eof_within(reader, WAIT_S)
        writer.close()
        await asyncio.wait({all_done}, timeout=WAIT_S)
        assert finished == [tunnel], "on_finished did not run (once): the pipe keeps its place"
        assert closed_for_us, "the client was left open with no upstream to answer it"
        await asyncio.sleep(0)  # a connection_lost still on its way changes nothing
        assert finished == [tunnel]
    finally:
        if writer is not None:
            writer.close()
        origin.close()
        front.close()


@pytest.mark.parametrize("when", ["told-elsewhere", "closing"])
@pytest.mark.parametrize("loop_factory", loop_factories())
def test_an_upstream_ended_before_the_client_joins_is_counted_and_the_tunnel_finishes(
    loop_factory: Any, when: str
) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_scenario(when))
