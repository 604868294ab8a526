"""A closed client connection is freed as soon as it closes, by reference counting alone.

The malformed-input run (bench/malformed.py) found this. A ClientConnection and its llhttp parser
refer to each other, so a closed connection, with its last request and that request's header
fields and body, lives on until the cycle collector's next full pass. With 3,000 requests that each
carry 200 fields of 400 bytes (431), the proxy's RSS grew from 60 to 351 MiB; a forced
``gc.collect()`` brought it back to 76 MiB.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from signing_proxy.net.request import Limits, Request
from signing_proxy.net.server import ClientConnection, Engine
from tests.harness import WAIT_S

HEAD_FIELDS = 200  # each 400 bytes: 80 KB, over the 64 KiB head limit (431)


class Refuse:
    """A handler that never gets a request here: the head is refused by the engine (431)."""

    def connection_made(self, conn: ClientConnection) -> None:
        pass

    async def serve(self, conn: ClientConnection, req: Request) -> bool:
        return False


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_a_closed_connection_is_freed_without_the_cycle_collector(no_cycle_collector: None) -> None:
    tasks: set[asyncio.Task[object]] = set()

    def spawn(coro: object) -> asyncio.Task[object]:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    limits = Limits(max_header_bytes=65536, max_body_bytes=1024, client_idle_s=5, read_s=5)
    engine = Engine(Refuse(), limits, spawn)
    server = await asyncio.get_running_loop().create_server(engine.protocol, "127.0.0.1", 0)
    writer: asyncio.StreamWriter | None = None
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
        async with asyncio.timeout(WAIT_S):
            while not engine.connections:  # noqa: ASYNC110 - a state with no event of its own
                await asyncio.sleep(0.01)
        (conn,) = engine.connections
        gone = weakref.ref(conn)
        del conn
        fields = "".join(f"X-{n}: {'v' * 400}\r\n" for n in range(HEAD_FIELDS))
        writer.write(f"GET http://127.0.0.1/ HTTP/1.1\r\nHost: x\r\n{fields}\r\n".encode())
        answer = await asyncio.wait_for(reader.read(-1), WAIT_S)
        assert answer.startswith(b"HTTP/1.1 431 ")
        # Our side stays open: the proxy closes at the end of its linger (net.server.LINGER_S), from
        # its own timer. (A FIN from us ends the linger early, and the linger timer, still pending,
        # then holds the connection until LINGER_S has passed.)
        async with asyncio.timeout(WAIT_S):
            while engine.connections or tasks:  # noqa: ASYNC110 - a state with no event of its own
                await asyncio.sleep(0.01)
        await asyncio.sleep(0)  # the transport's connection_lost callback has run
        assert gone() is None, [type(r).__name__ for r in gc.get_referrers(gone())]
    finally:
        if writer is not None:
            writer.close()
        server.close()
        await asyncio.wait_for(server.wait_closed(), WAIT_S)
