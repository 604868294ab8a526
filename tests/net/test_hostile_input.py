"""Issue "the proxy under hostile clients": the engine's bounds, one test per reproduced item.

Engine-level tests drive ``net.server`` with a handler that can hold a request in flight; the
proxy-level ones send raw bytes through a real ``signing-proxy run`` to a verifying origin.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from signing_proxy.config import TimeoutsConfig, UpstreamConfig
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.errors import ProxyError
from signing_proxy.net import upstream
from signing_proxy.net.client import HttpClient
from signing_proxy.net.forward import forward
from signing_proxy.net.framing import SMALL_PIECE_BYTES, Outgoing, keep_piece, outgoing
from signing_proxy.net.request import Limits, Request
from signing_proxy.net.server import ClientConnection, Engine
from signing_proxy.net.upstream import UpstreamPool
from signing_proxy.net.websocket import _Handshake
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, until, wait_for
from tests.memory import held_after
from tests.net.test_engine import body_or_refused, exchange, running
from tests.proxy.raw_upstream import raw_backend

KEY = SigningKey.generate()
BIG = 200_000  # far above every limit below; never sent whole by a well-behaved test


class Holding:
    """Answers each request with its body; holds the first one until ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.headers: list[list[tuple[str, str]]] = []
        self.first_in_flight = asyncio.Event()

    def connection_made(self, conn: ClientConnection) -> None:
        pass

    async def serve(self, conn: ClientConnection, req: Request) -> bool:
        body = await body_or_refused(conn, req)
        if body is None:
            return False
        self.headers.append(list(req.headers))
        if len(self.headers) == 1:
            self.first_in_flight.set()
            await self.release.wait()
        conn.local_response(200, "text/plain", body)
        return conn.keep_alive


@pytest.fixture
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Engine, Holding, int]]:
    limits = getattr(request, "param", None) or Limits(
        max_header_bytes=4096, max_body_bytes=64, client_idle_s=5, read_s=5, max_request_line_bytes=1024
    )
    handler = Holding()
    async with running(handler, limits) as (engine, port):
        try:
            yield engine, handler, port
        finally:
            handler.release.set()


async def opened(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)


# --- 1. header limits are checked only after a header is complete ---------------------------------


async def test_header_limits_are_checked_while_a_long_url_is_still_arriving(
    rig: tuple[Engine, Holding, int],
) -> None:
    _, handler, port = rig
    reader, writer = await opened(port)
    writer.write(b"GET /" + b"a" * BIG)  # never finished: the answer must not wait for the end of it
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    assert head.startswith((b"HTTP/1.1 414 ", b"HTTP/1.1 431 "))
    assert handler.headers == []
    writer.close()


async def test_header_limits_are_checked_while_a_long_field_is_still_arriving(
    rig: tuple[Engine, Holding, int],
) -> None:
    _, handler, port = rig
    reader, writer = await opened(port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * BIG)  # no end of line, ever
    answer = await asyncio.wait_for(reader.read(-1), WAIT_S)
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert b'"reason":"header-too-large"' in answer
    assert handler.headers == []
    writer.close()


async def test_header_limits_count_fields(rig: tuple[Engine, Holding, int]) -> None:
    _, _, port = rig
    reader, writer = await opened(port)
    writer.write(b"GET / HTTP/1.1\r\n" + b"A: b\r\n" * 300 + b"\r\n")
    answer = await asyncio.wait_for(reader.read(-1), WAIT_S)
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert b'"reason":"too-many-header-fields"' in answer
    writer.close()


# --- 2. memory per connection and in total is unbounded in practice ---------------------------------


async def test_memory_per_connection_is_bounded_to_one_request_read_ahead(
    rig: tuple[Engine, Holding, int],
) -> None:
    engine, handler, port = rig
    reader, writer = await opened(port)
    one = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n" + b"b" * 50
    writer.write(one)
    await asyncio.wait_for(handler.first_in_flight.wait(), WAIT_S)
    (conn,) = engine.connections
    writer.write(one)  # the read-ahead
    async with asyncio.timeout(WAIT_S):
        while not conn._reading_paused:  # noqa: ASYNC110 - a state with no event of its own
            await asyncio.sleep(0.01)
    assert conn.transport is not None
    assert not conn.transport.is_reading()  # nothing more is read while two requests are held
    writer.write(one * 4)  # stays in the kernel's buffers, not ours
    await writer.drain()
    assert len(conn._ready) == 1
    assert engine.buffered == 2 * 50  # the one in flight and the one read ahead
    handler.release.set()
    answers = b""
    while answers.count(b"HTTP/1.1 200 ") < 6:
        answers += await asyncio.wait_for(reader.read(65536), WAIT_S)
    writer.close()


@pytest.mark.parametrize(
    "rig",
    [Limits(max_header_bytes=4096, max_body_bytes=64, client_idle_s=5, read_s=5, max_connections=2)],
    indirect=True,
)
async def test_memory_in_total_is_bounded_by_max_connections(rig: tuple[Engine, Holding, int]) -> None:
    engine, _, port = rig
    kept = [await opened(port) for _ in range(2)]
    for _, writer in kept:
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    reader, writer = await opened(port)
    answer = await asyncio.wait_for(reader.read(-1), WAIT_S)
    assert answer.startswith(b"HTTP/1.1 503 ")
    assert b"Retry-After: 1\r\n" in answer
    assert b'"reason":"too-many-connections"' in answer
    assert engine.refused == 1
    for _, w in [*kept, (reader, writer)]:
        w.close()


@pytest.mark.parametrize(
    "rig",
    [Limits(max_header_bytes=4096, max_body_bytes=64, client_idle_s=5, read_s=5, max_buffered_bytes=100)],
    indirect=True,
)
async def test_memory_in_total_is_bounded_by_max_buffered_bytes(rig: tuple[Engine, Holding, int]) -> None:
    engine, handler, port = rig
    first_r, first_w = await opened(port)
    first_w.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 60\r\n\r\n" + b"a" * 60)
    await asyncio.wait_for(handler.first_in_flight.wait(), WAIT_S)  # 60 bytes held while it is served
    reader, writer = await opened(port)
    writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 60\r\n\r\n" + b"a" * 60)
    answer = await asyncio.wait_for(reader.read(-1), WAIT_S)  # answered at once, never a wait
    assert answer.startswith(b"HTTP/1.1 503 ")
    assert b"Retry-After: 1\r\n" in answer
    assert b'"reason":"server-busy"' in answer
    handler.release.set()
    assert (await asyncio.wait_for(first_r.readuntil(b"\r\n\r\n"), WAIT_S)).startswith(b"HTTP/1.1 200 ")
    for w in (first_w, writer):
        w.close()
    assert engine.buffered == 0  # every byte charged was given back


@pytest.mark.parametrize(
    "rig",
    [
        Limits(
            max_header_bytes=4096, max_body_bytes=8 << 20, client_idle_s=5, read_s=5, max_buffered_bytes=100
        )
    ],
    indirect=True,
)
async def test_a_refused_upload_is_read_to_its_end_and_answered_not_reset(
    rig: tuple[Engine, Holding, int],
) -> None:
    """Over the budget, a 6 MiB upload is answered 503 at once; the connection then lingers until
    the whole declared body has arrived (up to max_body_bytes), so its sender, writing first and
    reading after as most clients do, reads the 503 instead of a reset."""
    _, _, port = rig
    reader, writer = await opened(port)
    size = 6 << 20
    writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
    chunk = b"a" * 65536
    for _ in range(size // len(chunk)):
        writer.write(chunk)
        await asyncio.wait_for(writer.drain(), WAIT_S)
    answer = await asyncio.wait_for(reader.read(-1), WAIT_S)
    assert answer.startswith(b"HTTP/1.1 503 ")
    assert b'"reason":"server-busy"' in answer
    writer.close()


# --- 3. chunked trailers are merged into the headers -------------------------------------------------


async def test_chunked_trailers_are_not_merged_into_the_headers(rig: tuple[Engine, Holding, int]) -> None:
    _, handler, port = rig
    handler.release.set()
    reader, writer = await opened(port)
    writer.write(
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b"3\r\nabc\r\n0\r\nAuthorization: Bearer from-trailer\r\n\r\n"
    )
    answer = await asyncio.wait_for(reader.read(-1), WAIT_S)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith(b"abc")
    names = [name.lower() for name, _ in handler.headers[0]]
    assert "authorization" not in names
    writer.close()


async def test_a_trailer_section_is_bounded_while_it_arrives(rig: tuple[Engine, Holding, int]) -> None:
    """llhttp buffers a trailer field whole before calling back, as it does a head's: an endless one
    grew the proxy's memory without bound (and cost quadratic time) until the read timeout."""
    _, handler, port = rig
    handler.release.set()
    answer = await exchange(
        port,
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: "
        + b"a" * BIG,  # the trailer field never ends
    )
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert b'"reason":"header-too-large"' in answer


async def test_a_long_chunked_body_is_not_a_long_trailer(rig: tuple[Engine, Holding, int]) -> None:
    """The bound counts what follows the body's last bytes: chunks of any number pass it."""
    _, handler, port = rig
    handler.release.set()
    # 60 one-byte chunks with extensions: ~7 KB of framing around 60 bytes of content (limits 4 KiB, 64)
    chunks = b"1;ext=" + b"e" * 100 + b"\r\nx\r\n"
    chunks = chunks * 60 + b"0\r\nX-Sum: 1\r\n\r\n"
    head = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    answer = await exchange(port, head + chunks)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith(b"x" * 60)


class HoldingBody:
    """Holds each request, its body still buffered by the engine, until ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.requests: list[Request] = []

    def connection_made(self, conn: ClientConnection) -> None:
        pass

    async def serve(self, conn: ClientConnection, req: Request) -> bool:
        self.requests.append(req)
        await self.release.wait()
        conn.local_response(200, "text/plain", await conn.read_body(req))
        return conn.keep_alive


async def test_a_body_sent_a_byte_a_chunk_holds_about_its_own_size() -> None:
    """Each chunk's data was kept as its own piece, uncounted by ``max_body_bytes`` and
    ``max_buffered_bytes``: through a real proxy, 2 MiB sent a byte a chunk grew it by 178 MiB; here
    (Python shares one-byte objects, so only the list's slots count) 550 KiB held for 64 KiB. Now
    small pieces join one buffer as they come: about 67 KiB."""
    size = 64 * 1024
    wire = b"1\r\nx\r\n" * size + b"0\r\n\r\n"
    head = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    handler = HoldingBody()
    limits = Limits(max_header_bytes=4096, max_body_bytes=1 << 20, client_idle_s=5, read_s=5)
    async with running(handler, limits) as (_, port):
        reader, writer = await opened(port)
        try:
            with held_after() as held:
                writer.write(head + wire)
                await asyncio.wait_for(writer.drain(), WAIT_S)
                await until(lambda: bool(handler.requests) and handler.requests[0].complete)
            handler.release.set()
            answer = await asyncio.wait_for(reader.read(-1), WAIT_S)
        finally:
            writer.close()
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith(b"\r\n\r\n" + b"x" * size)
    assert held.bytes < 3 * size, held.bytes


def test_small_pieces_join_and_a_body_in_one_piece_is_not_copied() -> None:
    one = b"a" * 100
    pieces: list[bytes | bytearray] = []
    keep_piece(pieces, one)
    assert pieces[0] is one  # the common body: kept as it came
    for _ in range(1000):
        keep_piece(pieces, b"b")
    assert len(pieces) == 1
    big = b"c" * SMALL_PIECE_BYTES
    keep_piece(pieces, big)
    keep_piece(pieces, b"d")
    keep_piece(pieces, b"e")
    assert len(pieces) == 3
    assert pieces[1] is big
    assert b"".join(pieces) == one + b"b" * 1000 + big + b"de"


# --- through a real proxy ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def origin() -> Iterator[VerifyingOrigin]:
    with VerifyingOrigin() as server:
        server.trust(KEY)
        yield server


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    with ProxyProcess(tmp_path_factory.mktemp("hostile"), {"log": {"format": "json"}}, key=KEY) as process:
        yield process


def raw(proxy: ProxyProcess, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_chunked_trailers_never_reach_the_origin_as_signed_headers(
    proxy: ProxyProcess, origin: VerifyingOrigin
) -> None:
    answer = raw(
        proxy,
        f"POST {origin.url('/trailer')} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        "Connection: close\r\n\r\n3\r\nabc\r\n0\r\nAuthorization: Bearer from-trailer\r\n\r\n".encode(),
    )
    assert answer.startswith(b"HTTP/1.1 200 ")
    arrival = origin.arrivals[-1]
    assert arrival.verified
    assert arrival.body == b"abc"
    assert arrival.header("authorization") == ""  # the agent sent none: empty, covered, signed
    assert "from-trailer" not in json.dumps(arrival.lines)


@pytest.mark.parametrize(
    "target",
    [
        "http://a..b/",
        "http://[zz]/",
        "http://-bad.example/",
        "http://xn--/",
        "http://x/100%",
        f"http://x:{'9' * 4301}/",  # int() refuses it with a ValueError: once a 500 and a traceback
    ],
)
def test_some_inputs_get_no_response_now_get_a_400_problem(proxy: ProxyProcess, target: str) -> None:
    before = len(proxy.stderr_lines)
    answer = raw(proxy, f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert json.loads(body)["reason"] == "malformed-target"
    assert not any("Traceback" in line for line in proxy.stderr_lines[before:])


@pytest.mark.parametrize("host", ["2130706433", "127.1", "0x7f.1", "0177.0.0.1"])
def test_a_connect_to_a_numeric_alias_of_an_address_is_refused(proxy: ProxyProcess, host: str) -> None:
    """The resolver reads each as 127.0.0.1, while tunnel and unsigned rules naming 127.0.0.1 did not
    match it and a leaf was minted for DNS:0177.0.0.1 (which OpenSSL reads as the IP 177.0.0.1)."""
    answer = raw(proxy, f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert json.loads(body)["reason"] == "malformed-target"


def test_a_long_url_through_the_proxy_is_414_before_it_ends(tmp_path: Path) -> None:
    config = {"limits": {"max_request_line_bytes": 2048}}
    with (
        ProxyProcess(tmp_path, config, key=KEY) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock,
    ):
        sock.sendall(b"GET http://127.0.0.1/" + b"a" * 8192)  # and nothing more
        assert sock.recv(65536).startswith(b"HTTP/1.1 414 ")


@pytest.mark.parametrize("early_requests", [0, 3])
def test_requests_pipelined_with_a_connect_are_read_no_faster_than_served(
    tmp_path: Path, early_requests: int
) -> None:
    """Plain HTTP sent in the same write as the CONNECT went to the tunnel's inner connection, which
    paused reading after two; the tunnel then resumed the socket, undoing that pause, and every
    request after it was kept unparsed: 200 MiB streamed to an upstream that never answers grew the
    proxy by 270 MiB. Now the client is held back by the socket, as after the 200."""
    answered = threading.Event()

    def silent(conn: socket.socket) -> None:  # reads the first request, never answers it
        with conn:
            answered.wait(WAIT_S)

    request = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
    with raw_backend(silent) as port:
        config = {"intercept": {"allowed_ports": [port]}}
        with (
            ProxyProcess(tmp_path, config, key=KEY) as proxy,
            socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock,
        ):
            connect = f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
            sock.sendall(connect + request * early_requests)
            before = proxy.rss_kib()
            sock.settimeout(1.0)  # no progress for a second: the proxy has stopped reading
            sent, chunk = 0, request * (65536 // len(request))
            with contextlib.suppress(TimeoutError):
                while sent < 64 << 20:
                    sock.sendall(chunk)
                    sent += len(chunk)
            grown_mib = (proxy.rss_kib() - before) / 1024
            answered.set()
    assert sent < 16 << 20, f"{sent >> 20} MiB read from a client whose first request is unanswered"
    assert grown_mib < 16, grown_mib


async def fetched_from(
    serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> ProxyError:
    """How a fetch with a 4 KiB head limit from an upstream that runs ``serve`` is refused."""
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = UpstreamPool(
        UpstreamConfig(), connect_timeout_s=WAIT_S, read_timeout_s=WAIT_S, max_head_bytes=4096
    )
    client = HttpClient(pool, TimeoutsConfig())
    try:
        with pytest.raises(ProxyError) as info:
            await asyncio.wait_for(client.fetch("GET", f"http://127.0.0.1:{port}/", max_bytes=1024), WAIT_S)
        return info.value
    finally:
        pool.close()
        server.close()


async def test_header_limits_apply_to_upstream_response_heads_while_they_arrive() -> None:
    async def endless_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * BIG)  # the head never ends
        await writer.drain()
        await asyncio.sleep(WAIT_S)  # hold the connection open, sending nothing more

    refusal = await fetched_from(endless_head)
    assert (refusal.status, refusal.reason) == (502, "upstream-header-too-large")


async def test_upstream_trailers_are_bounded_while_they_arrive() -> None:
    """A response's trailer field, endless: each read pushes the read timeout on, so only a bound on
    what the parser holds stops it (it grew the proxy by what the upstream sent)."""

    async def endless_trailer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nX-T: ")
        with contextlib.suppress(ConnectionError):
            for _ in range(64):  # 4 MiB of one field, far past the 4 KiB bound
                writer.write(b"a" * 65536)
                await writer.drain()
        await asyncio.sleep(WAIT_S)

    refusal = await fetched_from(endless_trailer)
    assert (refusal.status, refusal.reason) == (502, "upstream-header-too-large")


def test_a_body_answered_without_being_read_gives_its_budget_back(proxy: ProxyProcess) -> None:
    """/healthz answers a POST without reading its body; the body still arriving was counted again
    into the buffered budget (limits.max_buffered_bytes) and never given back: a dozen such
    requests refused every upload with 503 until a restart."""
    size = 256 * 1024
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
        for _ in range(3):
            sock.sendall(f"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode())
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
            sock.sendall(b"b" * size)  # the body of the request already answered
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    metrics = b"".join(chunks).decode()
    assert "\nsigning_proxy_buffered_body_bytes 0.0\n" in metrics


async def test_a_websocket_handshake_answer_keeps_its_head_and_bounds_what_follows() -> None:
    """The upstream's answer to a handshake, read before any pipe exists: trailers never join the
    head that is relayed, an endless one is cut off, a 100 is interim and a framed 1xx is refused."""
    refusal = _Handshake(max_head_bytes=1024)
    refusal.data_received(b"HTTP/1.1 100 Continue\r\n\r\n")
    refusal.data_received(b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nno\r\n0\r\n")
    refusal.data_received(b"Set-Cookie: sid=from-trailer\r\n\r\n")
    await asyncio.wait_for(refusal.done, WAIT_S)
    assert (refusal.status, refusal.headers, refusal.body) == (
        403,
        [(b"Transfer-Encoding", b"chunked")],
        [b"no"],
    )

    endless = _Handshake(max_head_bytes=1024)
    endless.data_received(b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nno\r\n0\r\n")
    for i in range(100):
        endless.data_received(b"Set-Cookie: sid=%05d\r\n" % i)
    with pytest.raises(ProxyError) as cut:
        await asyncio.wait_for(endless.done, WAIT_S)
    assert cut.value.reason == "upstream-header-too-large"

    framed = _Handshake(max_head_bytes=1024)
    framed.data_received(b"HTTP/1.1 150 X\r\nContent-Length: 2\r\n\r\nhi")
    with pytest.raises(ProxyError) as bad:
        await asyncio.wait_for(framed.done, WAIT_S)
    assert bad.value.reason == "upstream-bad-response"


class Answering:
    """Answers each request with ``size`` bytes, waits for the client to read them, then closes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.left = -1  # what the transport still held after the answer was written

    def connection_made(self, conn: ClientConnection) -> None:
        pass

    async def serve(self, conn: ClientConnection, req: Request) -> bool:
        conn.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % self.size + b"x" * self.size)
        conn.outbox.flush()
        assert conn.transport is not None
        self.left = conn.transport.get_write_buffer_size()
        await conn.drain()
        return False


async def not_reading(port: int) -> socket.socket:
    """A client connected to ``port`` that will read nothing: a 4 KiB receive buffer, non-blocking."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock


async def never_reading(size: int, limits: Limits, wait_s: float) -> tuple[int, Answering]:
    """An engine answering ``size`` bytes to a client that sends a request and reads nothing: the
    connections it still counts after ``wait_s``, and the handler."""
    loop = asyncio.get_running_loop()
    handler = Answering(size)
    async with running(handler, limits) as (engine, port):
        sock = await not_reading(port)
        try:
            await loop.sock_sendall(sock, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.sleep(wait_s)  # the client reads nothing
            return engine.open_count(), handler
        finally:
            sock.close()


async def test_a_connection_closing_to_a_client_that_reads_nothing_gives_its_place_back() -> None:
    """An answer whose end fits under the write buffer's mark never pauses writing, so nothing
    waits on the client; asyncio's close then waits for it to read, without end, and the connection
    held one of limits.max_connections for good. Now it is aborted after client_idle_s."""
    limits = Limits(max_header_bytes=1024, max_body_bytes=64, client_idle_s=0.5, read_s=0.5)
    _, probed = await never_reading(16_000_000, limits, 0.3)  # what the kernels take, at most
    taken = probed.size - probed.left
    still_open, handler = await never_reading(taken + 20_000, limits, 4 * limits.client_idle_s)
    assert 0 < handler.left < 64 * 1024  # the end was left in the buffer, under the mark
    assert still_open == 0


async def no_content(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    writer.close()


@pytest.fixture
async def origins() -> AsyncIterator[list[str]]:
    """Ten origins on 127.0.0.2 to 127.0.0.11, each answering 204 to every request."""
    servers = [await asyncio.start_server(no_content, f"127.0.0.{i}", 0) for i in range(2, 12)]
    try:
        yield [f"http://{host}:{port}/" for host, port in (s.sockets[0].getsockname()[:2] for s in servers)]
    finally:
        for server in servers:
            server.close()


async def fetched_each(pool: UpstreamPool, urls: list[str]) -> None:
    client = HttpClient(pool, TimeoutsConfig())
    for url in urls:
        answer = await asyncio.wait_for(client.fetch("GET", url, max_bytes=16), WAIT_S)
        assert answer.status == 204


async def test_an_origin_whose_idle_connections_are_gone_leaves_nothing_in_the_pool(
    origins: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients choose host names (wildcard DNS makes them unlimited): each left an entry in the pool
    after its connections expired, ~1 KB per name, for good."""
    monkeypatch.setattr(upstream, "POOL_IDLE_S", 0.05)
    pool = UpstreamPool(UpstreamConfig(), connect_timeout_s=WAIT_S, read_timeout_s=WAIT_S)
    try:
        await fetched_each(pool, origins)
        assert pool.idle_origins == len(origins)  # kept for reuse, one origin each
        await until(lambda: pool.idle_origins == 0)  # expired: nothing of them stays
    finally:
        pool.close()


async def test_idle_connections_are_bounded_in_all_not_only_per_origin(origins: list[str]) -> None:
    """Only each origin's idle connections were bounded: many origins kept many sockets open."""
    pool = UpstreamPool(UpstreamConfig(pool_max_idle=3), connect_timeout_s=WAIT_S, read_timeout_s=WAIT_S)
    try:
        await fetched_each(pool, origins)
        assert pool.idle_origins == 3
        await fetched_each(pool, origins[:3])  # those kept are reused, and kept again
        assert (pool.idle_origins, pool.connections_opened) == (3, len(origins))
    finally:
        pool.close()


async def test_an_idle_pooled_connection_holds_nothing_of_the_answer_it_carried() -> None:
    """An origin's answer head stayed parsed on its connection while the connection idled in the
    pool: 7,000 short field lines (56 KB) are about 0.6 MB of tuples, and the pool keeps up to 1,024
    idle connections, to origins a client may name."""
    lines = b"X-a: b\r\n" * 7000

    ended = asyncio.Event()

    async def many_fields(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 204 No Content\r\n" + lines + b"\r\n")
        writer.close()
        ended.set()

    server = await asyncio.start_server(many_fields, "127.0.0.1", 0)
    pool = UpstreamPool(UpstreamConfig(), connect_timeout_s=WAIT_S, read_timeout_s=WAIT_S)
    try:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
        await fetched_each(pool, [url])  # the pool's own structures, before measuring
        with held_after() as held:
            await fetched_each(pool, [url])
            assert pool.idle_origins == 1
        assert held.mib < 0.3  # 0.57 MiB while the idle connection kept the head
    finally:
        pool.close()
        server.close()
        await asyncio.wait_for(ended.wait(), WAIT_S)  # the origin's side closed too


def test_a_strangers_connect_target_is_logged_at_a_hosts_length(proxy: ProxyProcess) -> None:
    """A refused CONNECT logged its whole target (up to 8 KiB): a line longer than one pipe write,
    which other writers of a shared stderr (workers) could tear."""
    answer = raw(proxy, b"CONNECT " + b"a" * 8000 + b".example:443 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b'"reason":"malformed-target"' in answer

    def logged() -> list[dict[str, object]]:
        docs = [json.loads(line) for line in proxy.stderr_lines if line.startswith('{"event":"request"')]
        return [doc for doc in docs if doc["method"] == "CONNECT" and str(doc["host"]).startswith("a")]

    wait_for(lambda: bool(logged()), "the CONNECT's access line")
    host = logged()[-1]["host"]
    assert isinstance(host, str)
    assert host.startswith("aaaa")
    assert len(host) <= 253 + len(":65535")


class Refusing:
    """Answers every request with a small problem and keeps the connection, as the proxy answers
    what it refuses or serves itself (a 404 no-route, a 407, a gateway's 401): no wait on the client."""

    def __init__(self) -> None:
        self.served = 0
        self.connections: list[ClientConnection] = []

    def connection_made(self, conn: ClientConnection) -> None:
        self.connections.append(conn)

    async def serve(self, conn: ClientConnection, req: Request) -> bool:
        self.served += 1
        conn.write_problem(ProxyError(404, "no-route", "/nope is not a proxied URL or a configured route"))
        return conn.keep_alive


async def test_answers_a_client_never_reads_wait_in_its_socket_not_in_our_memory() -> None:
    """A client that sent request after request and read nothing had every answer written, kept in
    the transport's buffer: a review measured 50 MiB to 213 MiB of resident memory for 22 MiB of
    404s sent on one connection (and on with 407s, and with a gateway's 401s). Now the next request
    waits until the client reads what it was sent; the connection is cut after client_idle_s."""
    loop = asyncio.get_running_loop()
    limits = Limits(max_header_bytes=1024, max_body_bytes=64, client_idle_s=5, read_s=5)
    handler = Refusing()
    count = 50_000  # 1.6 MB of requests; their answers, about 14 MB
    async with running(handler, limits) as (_engine, port):
        sock = await not_reading(port)
        sender = loop.create_task(loop.sock_sendall(sock, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n" * count))
        try:
            await asyncio.sleep(2.0)  # the client reads nothing
            (conn,) = handler.connections
            assert conn.transport is not None
            held = conn.transport.get_write_buffer_size() + conn.outbox.held_bytes
            assert held < 1024 * 1024, (held, handler.served)
            assert handler.served < count
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            sock.close()


@pytest.mark.parametrize(
    "status_line",
    [b"HTTP/1.1 000 Zero", b"HTTP/1.1 099 Low", b"HTTP/1.1 200 O\x00K", b"HTTP/1.1 200 \x1b[31mRED\x1b[0m"],
)
async def test_an_upstream_status_line_no_client_could_read_is_a_502(status_line: bytes) -> None:
    """We rebuild the status line from the code and reason upstream sent: ``000`` went out as
    ``HTTP/1.1 0 Zero``, and control bytes in a reason went out as they came (RFC 9112 section 4:
    3DIGIT and 1*( HTAB / SP / VCHAR / obs-text ); RFC 9110 section 15: 100 to 599)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(status_line + b"\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    refused = await fetched_from(serve)
    assert (refused.status, refused.reason) == (502, "upstream-bad-response")
    assert "status line" in refused.detail


async def test_a_reason_phrase_with_tabs_and_obs_text_passes() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 599 Tr\xe8s\tbien\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = UpstreamPool(
        UpstreamConfig(), connect_timeout_s=WAIT_S, read_timeout_s=WAIT_S, max_head_bytes=4096
    )
    try:
        answer = await asyncio.wait_for(
            HttpClient(pool, TimeoutsConfig()).fetch("GET", f"http://127.0.0.1:{port}/", max_bytes=1024),
            WAIT_S,
        )
        assert (answer.status, answer.body) == (599, b"ok")
    finally:
        pool.close()
        server.close()


@pytest.mark.parametrize(
    "host_lines",
    [
        "",  # none, in HTTP/1.1
        "Host: a.example\r\nHost: b.example\r\n",
        "Host: a.example/b?c\r\n",
        "Host: user@a.example\r\n",
        "Host: a.example:port\r\n",
    ],
)
def test_a_request_without_exactly_one_valid_host_is_a_400(
    proxy: ProxyProcess, origin: VerifyingOrigin, host_lines: str
) -> None:
    """RFC 9112 section 3.2: a server MUST answer 400 to an HTTP/1.1 request without Host, with more
    than one Host line, or with an invalid one. They were served (Host is rebuilt from the target)."""
    before = len(origin.arrivals)
    answer = raw(
        proxy, f"GET {origin.url('/host')} HTTP/1.1\r\n{host_lines}Connection: close\r\n\r\n".encode()
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert json.loads(body)["reason"] == "malformed-host"
    assert len(origin.arrivals) == before


@pytest.mark.parametrize(
    ("version", "host_lines"),
    [("1.1", "Host: a.example\r\n"), ("1.1", "Host: \r\n"), ("1.1", "Host: [::1]:8080\r\n"), ("1.0", "")],
)
def test_one_host_or_an_http_1_0_request_without_one_is_served(
    proxy: ProxyProcess, origin: VerifyingOrigin, version: str, host_lines: str
) -> None:
    answer = raw(
        proxy, f"GET {origin.url('/host')} HTTP/{version}\r\n{host_lines}Connection: close\r\n\r\n".encode()
    )
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


LOCAL_ANSWER_BYTES = 16 * 1024 * 1024  # more than the kernel's buffers take on loopback


class AnswerThenForward:
    """Writes a large answer of its own, which the client does not read, then forwards to ``port``."""

    def __init__(self, port: int, pool: UpstreamPool) -> None:
        self.port = port
        self.pool = pool
        self.connections: list[ClientConnection] = []

    def connection_made(self, conn: ClientConnection) -> None:
        self.connections.append(conn)

    async def serve(self, conn: ClientConnection, req: Request) -> bool:
        conn.local_response(200, "text/plain", b"x" * LOCAL_ANSWER_BYTES)
        conn.outbox.flush()  # past the transport's high-water mark: writing pauses before forward
        target = parse_absolute_uri(f"http://127.0.0.1:{self.port}/big")
        out = outgoing("GET", target, [], b"", framed=False, keyid=None, via=None)

        async def again() -> Outgoing:
            return out

        await forward(conn, self.pool, out, again)
        return False


async def test_a_forwarded_answer_starting_while_the_client_is_paused_waits_for_it() -> None:
    """pause_writing pauses the upstream the client is fed from, but it came before this upstream
    was attached: the whole answer was read and buffered for a client that reads nothing (a
    review: 200 MiB of it). The upstream now starts paused when the client is."""
    loop = asyncio.get_running_loop()
    size = 64 * 1024 * 1024
    sent = 0

    writers: list[asyncio.StreamWriter] = []

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        writers.append(writer)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        with contextlib.suppress(ConnectionError):
            while sent < size:
                writer.write(b"y" * 65536)
                sent += 65536
                await writer.drain()
        writer.close()

    origin = await asyncio.start_server(big, "127.0.0.1", 0)
    pool = UpstreamPool(
        UpstreamConfig(), connect_timeout_s=WAIT_S, read_timeout_s=WAIT_S, max_head_bytes=4096
    )
    handler = AnswerThenForward(origin.sockets[0].getsockname()[1], pool)
    limits = Limits(max_header_bytes=1024, max_body_bytes=64, client_idle_s=5, read_s=5)
    try:
        async with running(handler, limits) as (_engine, port):
            sock = await not_reading(port)
            try:
                await loop.sock_sendall(sock, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                await asyncio.sleep(2.0)  # the client reads nothing
                (conn,) = handler.connections
                assert conn.transport is not None
                held = conn.transport.get_write_buffer_size()
                assert held < LOCAL_ANSWER_BYTES + 4 * 1024 * 1024, (held, sent)  # 60 MiB more before
                assert sent < size // 2
            finally:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()  # a reset: the proxy's next write fails, and it closes the upstream too
            await until(lambda: all(c.closed for c in handler.connections), "the client's end to be seen")
    finally:
        pool.close()
        origin.close()
        for writer in writers:  # the origin's side, still waiting to send the rest
            writer.transport.abort()
        await origin.wait_closed()
