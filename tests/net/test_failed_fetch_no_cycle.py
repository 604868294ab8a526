"""A failed fetch leaves nothing for the cycle collector: its frame, sink and body go at once.

A review found ``HttpClient.fetch`` (directories, revocation lists, manifests) failing mid-body kept
what it had read: the sink's future held the ``ProxyError``, the error's traceback held ``fetch``'s
frame, and the frame held the sink (and so the future). Twenty fetches reset one byte short of
4 MiB kept 100 MiB until ``gc.collect()``; the proxy freezes its start-up heap and raises the young
generation's threshold, so such a cycle waits long for a full pass. A connection that could not be
opened did the same through ``asyncio.wait_for`` (Python 3.11: its frame holds the task that holds
the error). Both event loops: their timer handles let go of their arguments differently.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from signing_proxy.errors import ProxyError
from signing_proxy.net.client import HttpClient
from tests.harness import WAIT_S
from tests.memory import left_in_cycles
from tests.proxy.raw_upstream import loop_factories

BODY_BYTES = 4 * 1024 * 1024 - 1  # what the upstream sends of the BODY_BYTES + 1 it announces


async def cut_one_byte_short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (BODY_BYTES + 1) + b"r" * BODY_BYTES)
    await writer.drain()
    writer.close()  # the body ends a byte short: upstream-reset


async def fetch_cut_short() -> str:
    server = await asyncio.start_server(cut_one_byte_short, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with HttpClient.standalone() as client:
            url = f"http://127.0.0.1:{port}/list.json"
            with pytest.raises(ProxyError) as failed:  # fetch's own deadline: wait_for would tie a cycle
                await client.fetch("GET", url, max_bytes=2 * BODY_BYTES, total_s=WAIT_S)
            reason = failed.value.reason
            del failed  # its traceback holds this frame, which holds it: the test's own cycle
            return reason
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), WAIT_S)


async def fetch_refused() -> str:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    async with HttpClient.standalone() as client:
        url = f"http://127.0.0.1:{port}/"
        with pytest.raises(ProxyError) as failed:
            await client.fetch("POST", url, body=b"b" * BODY_BYTES, max_bytes=64, total_s=WAIT_S)
        reason = failed.value.reason
        del failed
        return reason


@pytest.mark.parametrize("loop_factory", loop_factories())
def test_a_fetch_cut_off_mid_body_is_freed_without_the_cycle_collector(
    loop_factory: Any, no_cycle_collector: None
) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        reason = runner.run(fetch_cut_short())
        cycles = left_in_cycles()  # once the loop has run its last step (its handle holds the future)
    assert reason == "upstream-reset"
    assert cycles["HttpClient.fetch"] == 0, cycles
    assert cycles["_BufferingSink"] == 0, cycles


@pytest.mark.parametrize("loop_factory", loop_factories())
def test_a_fetch_whose_connection_failed_is_freed_without_the_cycle_collector(
    loop_factory: Any, no_cycle_collector: None
) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        reason = runner.run(fetch_refused())
        cycles = left_in_cycles()
    assert reason == "upstream-connect-failed"
    assert cycles["HttpClient.fetch"] == 0, cycles
