"""A closed client connection is freed as soon as it closes, by reference counting alone.

The malformed-input run (bench/malformed.py) found this. A ClientConnection and its llhttp parser
refer to each other, so a closed connection, with its last request and that request's header
fields and body, lives on until the cycle collector's next full pass. With 3,000 requests that each
carry 200 fields of 400 bytes (431), the proxy's RSS grew from 60 to 351 MiB; a forced
``gc.collect()`` brought it back to 76 MiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ssl
import weakref
from collections.abc import Iterator

import pytest

from signing_proxy.net.leaves import LeafContextCache
from signing_proxy.net.request import Limits, Request
from signing_proxy.net.server import ClientConnection, Engine
from signing_proxy.net.tunnel import TunnelStart
from signing_proxy.storage.ca import CertificateAuthority
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


class Inner(asyncio.Protocol):
    """What serves the requests inside an intercepted tunnel; here it only notes its transport."""

    def __init__(self, seen: list[weakref.ref[asyncio.BaseTransport]]) -> None:
        self.seen = seen

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.seen.append(weakref.ref(transport))


class Intercept:
    """Takes the connection over, as a CONNECT does, and starts TLS on it with a server context."""

    def __init__(self, context: ssl.SSLContext | None = None) -> None:
        self.context = context or ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.starts: list[weakref.ref[TunnelStart]] = []
        self.failures: list[str] = []  # names only: an exception's traceback would hold its frames
        self.transports: list[weakref.ref[asyncio.BaseTransport]] = []  # the tunnels' TLS transports

    def connection_made(self, conn: ClientConnection) -> None:
        pass

    async def serve(self, conn: ClientConnection, req: Request) -> bool:
        raw = conn.take_over()
        assert raw is not None
        start = TunnelStart(
            raw,
            host="a.example",
            port=443,
            context=self.context,
            client_ip=conn.client_ip,
            handshake_timeout_s=WAIT_S,
            inner=lambda _scheme: Inner(self.transports),
            on_failed=lambda _start, exc: self.failures.append(type(exc).__name__),
            handshakes=weakref.WeakKeyDictionary(),
            starting=set(),
        )
        self.starts.append(weakref.ref(start))
        start.begin(b"")
        return False


async def test_a_taken_over_connection_and_a_failed_handshake_are_freed_without_the_cycle_collector(
    no_cycle_collector: None,
) -> None:
    """A stranger's CONNECT followed by a broken ClientHello: the connection handed to the tunnel,
    the tunnel's start and its TLS session refer to each other while the handshake runs, and must not
    once it has failed (bench/malformed.py's connect-tls-garbage: 17 KiB a tunnel otherwise waits)."""
    tasks: set[asyncio.Task[object]] = set()

    def spawn(coro: object) -> asyncio.Task[object]:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    handler = Intercept()
    limits = Limits(max_header_bytes=65536, max_body_bytes=1024, client_idle_s=5, read_s=5)
    engine = Engine(handler, limits, spawn)
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
        writer.write(b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n")
        async with asyncio.timeout(WAIT_S):
            while not handler.starts:  # noqa: ASYNC110 - a state with no event of its own
                await asyncio.sleep(0.01)
        writer.write(b"\x16\x03\x01\x00\x05junk!")  # a TLS handshake record that is no ClientHello
        await asyncio.wait_for(reader.read(-1), WAIT_S)  # the proxy closes once the handshake fails
        async with asyncio.timeout(WAIT_S):
            while tasks:  # noqa: ASYNC110 - a state with no event of its own
                await asyncio.sleep(0.01)
        await asyncio.sleep(0)  # the transport's connection_lost callback has run
        assert handler.failures == ["SSLError"]
        assert gone() is None, [type(r).__name__ for r in gc.get_referrers(gone())]
        (start,) = handler.starts
        assert start() is None, [type(r).__name__ for r in gc.get_referrers(start())]
    finally:
        if writer is not None:
            writer.close()
        server.close()
        await asyncio.wait_for(server.wait_closed(), WAIT_S)


async def test_an_intercepted_tunnel_that_ends_is_freed_without_the_cycle_collector(
    no_cycle_collector: None,
) -> None:
    """A completed handshake, then the client leaves: the TLS session, its transport and the
    application protocol refer to each other while the tunnel lives, and must not once it has ended
    (600 tunnels of one request each grew the proxy by 14 MiB until a pass of the collector)."""
    tasks: set[asyncio.Task[object]] = set()

    def spawn(coro: object) -> asyncio.Task[object]:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    leaves = LeafContextCache(CertificateAuthority.generate())
    handler = Intercept(leaves.get("a.example"))
    limits = Limits(max_header_bytes=65536, max_body_bytes=1024, client_idle_s=5, read_s=5)
    engine = Engine(handler, limits, spawn)
    server = await asyncio.get_running_loop().create_server(engine.protocol, "127.0.0.1", 0)
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE  # what is checked here is memory, not trust
    try:
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
        writer.write(b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n")
        async with asyncio.timeout(WAIT_S):
            while not handler.starts:  # noqa: ASYNC110 - a state with no event of its own
                await asyncio.sleep(0.01)
            await writer.start_tls(client, server_hostname="a.example")
            while not handler.transports:  # noqa: ASYNC110 - a state with no event of its own
                await asyncio.sleep(0.01)
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await asyncio.wait_for(writer.wait_closed(), WAIT_S)
        async with asyncio.timeout(WAIT_S):
            while tasks:  # noqa: ASYNC110 - a state with no event of its own
                await asyncio.sleep(0.01)
        (transport,) = handler.transports
        for _ in range(100):  # the close runs through a few callbacks: up to a second for them
            if transport() is None:
                break
            await asyncio.sleep(0.01)
        assert handler.failures == []
        assert transport() is None, [type(r).__name__ for r in gc.get_referrers(transport())]
        (start,) = handler.starts
        assert start() is None, [type(r).__name__ for r in gc.get_referrers(start())]
    finally:
        leaves.close()
        server.close()
        await asyncio.wait_for(server.wait_closed(), WAIT_S)
