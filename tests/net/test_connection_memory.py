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
import socket
import ssl
import weakref
from collections.abc import Callable

from signing_proxy.net.leaves import LeafContextCache
from signing_proxy.net.request import Limits, Request
from signing_proxy.net.server import ClientConnection, Engine
from signing_proxy.net.tunnel import BlindTunnel, TunnelStart
from signing_proxy.storage.ca import CertificateAuthority
from tests.harness import WAIT_S, until
from tests.memory import held_after
from tests.net.test_engine import running

HEAD_FIELDS = 200  # each 400 bytes: 80 KB, over the 64 KiB head limit (431)
LIMITS = Limits(max_header_bytes=65536, max_body_bytes=1024, client_idle_s=5, read_s=5)


class Refuse:
    """A handler that never gets a request here: the head is refused by the engine (431)."""

    def connection_made(self, conn: ClientConnection) -> None:
        pass

    async def serve(self, conn: ClientConnection, req: Request) -> bool:
        return False


async def freed(ref: Callable[[], object]) -> bool:
    """Whether ``ref``'s object goes within a second (a close runs through a few callbacks)."""
    for _ in range(100):
        if ref() is None:
            return True
        await asyncio.sleep(0.01)
    return False


def referrers(ref: Callable[[], object]) -> list[str]:
    """What still holds ``ref``'s object: the failure message."""
    return [type(r).__name__ for r in gc.get_referrers(ref())]


async def connected(
    engine: Engine, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, weakref.ref[ClientConnection]]:
    """A client's connection, and a weak reference to the engine's side of it."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
    await until(lambda: engine.connections)
    (conn,) = engine.connections
    return reader, writer, weakref.ref(conn)


async def test_a_closed_connection_is_freed_without_the_cycle_collector(no_cycle_collector: None) -> None:
    tasks: set[asyncio.Task[object]] = set()
    async with running(Refuse(), LIMITS, tasks) as (engine, port):
        reader, writer, gone = await connected(engine, port)
        try:
            fields = "".join(f"X-{n}: {'v' * 400}\r\n" for n in range(HEAD_FIELDS))
            writer.write(f"GET http://127.0.0.1/ HTTP/1.1\r\nHost: x\r\n{fields}\r\n".encode())
            answer = await asyncio.wait_for(reader.read(-1), WAIT_S)
            assert answer.startswith(b"HTTP/1.1 431 ")
            # Our side stays open: the proxy closes at the end of its linger (net.server.LINGER_S), from
            # its own timer. (A FIN from us ends the linger early, and the linger timer, still pending,
            # then holds the connection until LINGER_S has passed.)
            await until(lambda: not engine.connections and not tasks)
            assert await freed(gone), referrers(gone)
        finally:
            writer.close()


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
    handler = Intercept()
    tasks: set[asyncio.Task[object]] = set()
    async with running(handler, LIMITS, tasks) as (engine, port):
        reader, writer, gone = await connected(engine, port)
        try:
            writer.write(b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n")
            await until(lambda: handler.starts)
            writer.write(b"\x16\x03\x01\x00\x05junk!")  # a TLS handshake record that is no ClientHello
            await asyncio.wait_for(reader.read(-1), WAIT_S)  # the proxy closes once the handshake fails
            await until(lambda: not tasks)
            assert handler.failures == ["SSLError"]
            assert await freed(gone), referrers(gone)
            (start,) = handler.starts
            assert await freed(start), referrers(start)
        finally:
            writer.close()


async def test_an_intercepted_tunnel_that_ends_is_freed_without_the_cycle_collector(
    no_cycle_collector: None,
) -> None:
    """A completed handshake, then the client leaves: the TLS session, its transport and the
    application protocol refer to each other while the tunnel lives, and must not once it has ended
    (600 tunnels of one request each grew the proxy by 14 MiB until a pass of the collector)."""
    leaves = LeafContextCache(CertificateAuthority.generate())
    handler = Intercept(leaves.get("a.example"))
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE  # what is checked here is memory, not trust
    tasks: set[asyncio.Task[object]] = set()
    try:
        async with running(handler, LIMITS, tasks) as (_, port):
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
            writer.write(b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n")
            await until(lambda: handler.starts)
            await asyncio.wait_for(writer.start_tls(client, server_hostname="a.example"), WAIT_S)
            await until(lambda: handler.transports)
            writer.close()
            with contextlib.suppress(ssl.SSLError, ConnectionError):
                await asyncio.wait_for(writer.wait_closed(), WAIT_S)
            await until(lambda: not tasks)
            assert handler.failures == []
            (transport,) = handler.transports
            assert await freed(transport), referrers(transport)
            (start,) = handler.starts
            assert await freed(start), referrers(start)
    finally:
        leaves.close()


def given(protocol: asyncio.Protocol) -> Callable[[], asyncio.Protocol]:
    """A protocol factory for one protocol that holds nothing else (not the test's own variables)."""
    return lambda: protocol


async def test_a_blind_tunnel_that_ends_is_freed_without_the_cycle_collector(
    no_cycle_collector: None,
) -> None:
    """A tunnel and its two sides refer to each other while bytes flow, and must not once both
    sides are gone: the tunnel log line is written first, from figures the sides still hold."""
    loop = asyncio.get_running_loop()

    async def echo_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read(100))
        await writer.drain()
        writer.close()  # the upstream ends the tunnel

    upstream = await asyncio.start_server(echo_once, "127.0.0.1", 0)
    finished: list[int] = []  # bytes from the client, read by the finishing callback
    client_sock, our_sock = socket.socketpair()
    try:
        port = upstream.sockets[0].getsockname()[1]
        tunnel = BlindTunnel(
            "127.0.0.1", f"127.0.0.1:{port}", lambda t: finished.append(t.client.bytes_in), idle_s=WAIT_S
        )
        await asyncio.wait_for(loop.create_connection(given(tunnel.upstream), "127.0.0.1", port), WAIT_S)
        raw, _ = await loop.connect_accepted_socket(asyncio.Protocol, sock=our_sock)
        tunnel.attach_client(raw, b"")
        del raw
        reader, writer = await asyncio.open_connection(sock=client_sock)
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.read(-1), WAIT_S) == b"ping"
        writer.close()
        await until(lambda: finished)
        assert finished == [4]
        gone = weakref.ref(tunnel)
        del tunnel
        assert await freed(gone), referrers(gone)
    finally:
        client_sock.close()
        upstream.close()
        await asyncio.wait_for(upstream.wait_closed(), WAIT_S)


class Count:
    """Reads each body, answers with its length, and keeps the connection: it holds no body."""

    def connection_made(self, conn: ClientConnection) -> None:
        pass

    async def serve(self, conn: ClientConnection, req: Request) -> bool:
        body = await conn.read_body(req)
        conn.local_response(200, "text/plain", b"%d" % len(body))
        return conn.keep_alive


async def test_an_idle_keep_alive_connection_holds_nothing_of_the_request_it_served() -> None:
    """A served request stayed referenced by its connection until the next one began: its body (up
    to limits.max_body_bytes, no longer counted against max_buffered_bytes) and its field lines, for
    as long as the client kept the connection idle (client_idle_s)."""
    body = b"b" * (4 * 1024 * 1024)
    limits = Limits(max_header_bytes=65536, max_body_bytes=len(body), client_idle_s=WAIT_S, read_s=WAIT_S)
    async with running(Count(), limits) as (engine, port):
        reader, writer, _conn = await connected(engine, port)
        try:
            with held_after() as held:
                head = f"POST http://127.0.0.1/ HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
                writer.write(head.encode() + body)
                answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
                assert answer.startswith(b"HTTP/1.1 200 ")
                assert await asyncio.wait_for(reader.readexactly(7), WAIT_S) == b"4194304"
                await until(lambda: engine.buffered == 0 and len(engine.connections) == 1)
        finally:
            writer.close()
    assert held.mib < 1.0  # 4.0 MiB while the connection kept the body
