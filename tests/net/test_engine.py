"""The engine alone: a connection parses, bounds and hands requests to any ``Handler``, with no app,
no signing and no configuration file. What the proxy does with a request is tested in tests/proxy."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator, Coroutine

import pytest

from signing_proxy.errors import ProxyError
from signing_proxy.net import server
from signing_proxy.net.request import AbortConnection, Limits, Request
from signing_proxy.net.server import ClientConnection, Engine, Handler

LIMITS = Limits(max_header_bytes=1024, max_body_bytes=64, client_idle_s=5.0, read_s=5.0)
WAIT_S = 5.0


async def body_or_refused(conn: ClientConnection, req: Request) -> bytes | None:
    """``req``'s body; None once a body the engine refuses (413, 503, 408) is answered with its
    problem and the connection set to close, as the proxy's handler does."""
    try:
        return await conn.read_body(req)
    except ProxyError as error:
        conn.keep_alive = False
        conn.write_problem(error)
        return None


class Echo:
    """A handler that answers each request with its method, target and body."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes, bytes]] = []
        self.connected: list[str] = []

    def connection_made(self, conn: ClientConnection) -> None:
        self.connected.append(conn.client_ip)

    async def serve(self, conn: ClientConnection, req: Request) -> bool:
        body = await body_or_refused(conn, req)
        if body is None:
            return False
        self.seen.append((req.method, req.url, body))
        conn.local_response(200, "text/plain", b"%s %s %s" % (req.method.encode(), req.url, body))
        return conn.keep_alive


@contextlib.asynccontextmanager
async def running(
    handler: Handler, limits: Limits, tasks: set[asyncio.Task[object]] | None = None
) -> AsyncIterator[tuple[Engine, int]]:
    """An engine serving ``handler`` on a free loopback port; its connections and tasks end after.
    ``tasks``: a set the caller watches, holding the tasks the engine spawned until they finish."""
    tasks = set() if tasks is None else tasks

    def spawn(coro: Coroutine[object, object, object]) -> asyncio.Task[object]:
        task = asyncio.get_running_loop().create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    eng = Engine(handler, limits, spawn)
    server = await asyncio.get_running_loop().create_server(eng.protocol, "127.0.0.1", 0)
    try:
        yield eng, server.sockets[0].getsockname()[1]
    finally:
        server.close()
        eng.close_all()
        for task in list(tasks):
            task.cancel()
        await asyncio.wait_for(server.wait_closed(), WAIT_S)


@pytest.fixture
async def engine() -> AsyncIterator[tuple[Engine, Echo, int]]:
    handler = Echo()
    async with running(handler, LIMITS) as (eng, port):
        yield eng, handler, port


async def exchange(port: int, raw: bytes, *, half_close: bool = False) -> bytes:
    """Send ``raw`` (then EOF, if ``half_close``) on a new connection; what comes back until the close."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
    writer.write(raw)
    if half_close:
        writer.write_eof()
    try:
        return await asyncio.wait_for(reader.read(-1), WAIT_S)
    finally:
        writer.close()


async def test_requests_reach_the_handler_in_order_over_one_connection(
    engine: tuple[Engine, Echo, int],
) -> None:
    _, handler, port = engine
    raw = (
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
        b"GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    answer = await exchange(port, raw)
    assert [s[:2] for s in handler.seen] == [("GET", b"/a"), ("POST", b"/b"), ("GET", b"/c")]
    assert handler.seen[1][2] == b"abc"
    assert answer.count(b"HTTP/1.1 200 OK") == 3
    assert answer.endswith(b"Connection: close\r\n\r\nGET /c ")
    assert handler.connected == ["127.0.0.1"]


async def test_a_header_section_over_the_limit_is_431_and_the_handler_never_sees_it(
    engine: tuple[Engine, Echo, int],
) -> None:
    _, handler, port = engine
    answer = await exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2000 + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert b'"reason":"header-too-large"' in answer
    assert handler.seen == []


async def test_a_body_over_the_limit_is_413(engine: tuple[Engine, Echo, int]) -> None:
    _, handler, port = engine
    answer = await exchange(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 65\r\n\r\n" + b"a" * 65)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b'"reason":"body-too-large"' in answer
    assert handler.seen == []


async def test_a_malformed_request_is_400_and_closes(engine: tuple[Engine, Echo, int]) -> None:
    _, handler, port = engine
    answer = await exchange(
        port, b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"Connection: close" in answer
    assert handler.seen == []


@pytest.mark.parametrize(
    "broken",
    [
        b"GET /b HTTP/1.1\r\nBad Header\r\n\r\n",  # a field line without a colon
        b"GARBAGE\r\n\r\n",  # not even a request line
        b"GET /b HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2000 + b"\r\n\r\n",  # a head over the limit
        b"POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # broken chunk
        b"GET /b HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",  # refused, never served
    ],
    ids=["field-line", "request-line", "head-too-large", "chunk-framing", "other-upgrade"],
)
@pytest.mark.parametrize("half_close", [False, True], ids=["open", "half-closed"])
async def test_a_broken_request_after_a_good_one_is_refused_after_the_good_ones_answer(
    engine: tuple[Engine, Echo, int], broken: bytes, half_close: bool
) -> None:
    # RFC 9112 section 9.3.2: answers go in the order of the requests. The refusal used to be
    # written at once and the connection half-closed: the good request was never answered, and its
    # client read the 400 as its answer.
    _, handler, port = engine
    # half-closed: the client sent all it will, and the answers it is owed still come
    answer = await exchange(port, b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n" + broken, half_close=half_close)
    assert [s[:2] for s in handler.seen] == [("GET", b"/a")]
    first, _, rest = answer.partition(b"GET /a ")
    assert first.startswith(b"HTTP/1.1 200 OK\r\n")
    assert rest.startswith(b"HTTP/1.1 4")
    assert b"Connection: close" in rest
    assert rest.count(b"HTTP/1.1 ") == 1


class Slow(Echo):
    """``Echo`` that holds each answer until ``go`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.started = asyncio.Event()

    async def serve(self, conn: ClientConnection, req: Request) -> bool:
        self.started.set()
        await self.go.wait()
        return await super().serve(conn, req)


async def test_a_broken_request_arriving_while_one_is_in_flight_waits_for_its_answer() -> None:
    handler = Slow()
    async with running(handler, LIMITS) as (_, port):
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
        try:
            writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.wait_for(handler.started.wait(), WAIT_S)
            writer.write(b"GET /b HTTP/1.1\r\nBad Header\r\n\r\n")
            await asyncio.sleep(0.05)  # the broken request is read while /a is in flight
            handler.go.set()
            answer = await asyncio.wait_for(reader.read(-1), WAIT_S)
        finally:
            writer.close()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert answer.index(b"GET /a ") < answer.index(b"HTTP/1.1 400 ")
    assert handler.seen == [("GET", b"/a", b"")]


async def test_pipelined_requests_are_parsed_no_further_ahead_than_the_bound() -> None:
    """One read of pipelined requests was parsed whole while the first was served: 256 KiB of
    minimal requests is ~14,000 parsed requests (5.7 MiB) on one connection. The queue now stops at
    MAX_PARSED_AHEAD (give or take one slice of heads), the rest waits as bytes, and every request is
    still answered, in order."""
    handler = Slow()
    count = 3000
    async with running(handler, LIMITS) as (engine, port):
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
        try:
            writer.write(b"".join(b"GET /%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(count)))
            await asyncio.wait_for(handler.started.wait(), WAIT_S)
            await asyncio.sleep(0.1)  # what was read is parsed as far as it will be
            (conn,) = engine.connections
            queued = len(conn._ready)
            handler.go.set()
            last = b"GET /%d " % (count - 1)
            answers = b""
            while last not in answers:
                answers += await asyncio.wait_for(reader.read(65536), WAIT_S)
        finally:
            writer.close()
    assert (
        1 < queued <= server.MAX_PARSED_AHEAD + server.PIPELINED_SLICE_BYTES // len("GET / HTTP/1.1\r\n\r\n")
    )
    assert [url for _method, url, _body in handler.seen] == [b"/%d" % i for i in range(count)]
    assert answers.count(b"HTTP/1.1 200 OK\r\n") == count


async def test_a_broken_body_of_the_request_in_flight_is_refused_at_once() -> None:
    # the error belongs to the request being served: nothing is answered before it, so nothing waits
    handler = Echo()
    async with running(handler, LIMITS) as (_, port):
        answer = await exchange(
            port, b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\nzz\r\n"
        )
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert answer.count(b"HTTP/1.1 ") == 1
    assert handler.seen == []


async def test_the_engine_tracks_open_connections(
    engine: tuple[Engine, Echo, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    eng, _, port = engine
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(reader.readuntil(b"GET / "), WAIT_S)
    assert len(eng.connections) == 1
    conn = next(iter(eng.connections))
    closed = asyncio.Event()
    original = conn.connection_lost

    def lost(exc: Exception | None) -> None:
        original(exc)
        closed.set()

    monkeypatch.setattr(conn, "connection_lost", lost)
    writer.close()
    await asyncio.wait_for(closed.wait(), WAIT_S)
    assert eng.connections == set()


async def test_an_upgrade_head_that_is_not_switched_ends_the_connection_after_its_answer(
    engine: tuple[Engine, Echo, int],
) -> None:
    # after an Upgrade head the bytes that follow are the new protocol's, never read as requests:
    # answered without switching, the connection says so and closes (it used to stay open, unread)
    _, _, port = engine
    head = (
        b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    answer = await exchange(port, head + b"GET /y HTTP/1.1\r\nHost: x\r\n\r\n")  # reads to EOF
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b"\r\nConnection: close\r\n" in answer
    assert answer.count(b"HTTP/1.1 ") == 1  # the bytes after the head were not served


async def test_a_client_that_reads_nothing_is_cut_off_after_client_idle_s() -> None:
    # a handler waiting for the client to read (drain) must not wait forever: that connection would
    # hold a slot of limits.max_connections for good
    outcome: list[str] = []

    class Flood:
        def connection_made(self, conn: ClientConnection) -> None:
            pass

        async def serve(self, conn: ClientConnection, req: Request) -> bool:
            conn.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (32 << 20) + b"x" * (32 << 20))
            try:
                await conn.drain()
            except AbortConnection:
                outcome.append("cut off")
                raise
            return False

    limits = dataclasses.replace(LIMITS, client_idle_s=0.5)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        async with running(Flood(), limits) as (eng, port):
            await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), WAIT_S)
            await loop.sock_sendall(sock, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            for _ in range(50):  # the client reads nothing
                if outcome:
                    break
                await asyncio.sleep(0.1)
            assert outcome == ["cut off"]
            assert not eng.connections
    finally:
        sock.close()


async def test_an_answer_written_as_the_client_half_closes_still_leaves(
    engine: tuple[Engine, Echo, int],
) -> None:
    """RFC 9112 section 9.6: the request and the client's EOF arrive together; the answer, written in
    the same pass as the EOF is read (a handler that does not wait), was dropped by the close."""
    _, handler, port = engine
    for _ in range(5):
        answer = await exchange(port, b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n", half_close=True)
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
        assert answer.endswith(b"GET /a "), answer
    assert len(handler.seen) == 5
