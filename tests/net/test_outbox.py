"""``Outbox``: small writes wait for the end of the event loop's pass, then leave in order.

What must hold: nothing is written while the pass runs; at its end each transport gets what was
written to it in one call, in order; a large write and everything that must follow held bytes
(close, half-close, handing the transport over) write the held bytes first; a closing transport
gets nothing more; and no outbox ever holds more than ``HOLD_MAX_BYTES``.
"""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from signing_proxy.config import UpstreamConfig
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.net.outbox import HOLD_MAX_BYTES, Outbox
from signing_proxy.net.request import Request
from signing_proxy.net.server import ClientConnection
from signing_proxy.net.upstream import UpstreamPool
from tests.net.test_engine import LIMITS, WAIT_S, exchange, running
from tests.net.test_timers import Sink


class Recorder:
    """A transport that records what is done to it, in one log shared by several."""

    def __init__(self, name: str, log: list[tuple[str, object]]) -> None:
        self.name = name
        self.log = log
        self.closing = False

    def write(self, data: bytes) -> None:
        assert not self.closing, "written after close"
        self.log.append((self.name, data))

    def write_eof(self) -> None:
        self.log.append((self.name, "eof"))

    def close(self) -> None:
        self.closing = True
        self.log.append((self.name, "close"))

    def is_closing(self) -> bool:
        return self.closing


def outbox(name: str, log: list[tuple[str, object]]) -> tuple[Outbox, Recorder]:
    box = Outbox(asyncio.get_running_loop())
    recorder = Recorder(name, log)
    box.transport = cast(asyncio.Transport, recorder)
    return box, recorder


async def test_writes_wait_for_the_end_of_the_pass_then_leave_joined_and_in_order() -> None:
    log: list[tuple[str, object]] = []
    a, _ = outbox("a", log)
    b, _ = outbox("b", log)
    a.write(b"1")
    b.write(b"x")
    a.write(b"2")
    log.append(("work", "the rest of the pass"))
    a.write(b"3")
    assert log == [("work", "the rest of the pass")]
    assert a.held_bytes == 3
    await asyncio.sleep(0)
    assert log == [("work", "the rest of the pass"), ("a", b"123"), ("b", b"x")]
    assert a.held_bytes == b.held_bytes == 0


async def test_a_write_in_a_later_pass_is_held_again() -> None:
    log: list[tuple[str, object]] = []
    box, _ = outbox("a", log)
    box.write(b"first")
    await asyncio.sleep(0)
    box.write(b"second")
    assert log == [("a", b"first")]
    await asyncio.sleep(0)
    assert log == [("a", b"first"), ("a", b"second")]


async def test_a_large_write_goes_at_once_after_what_is_held() -> None:
    log: list[tuple[str, object]] = []
    box, _ = outbox("a", log)
    large = b"L" * (HOLD_MAX_BYTES + 1)
    box.write(b"head")
    box.write(large)
    assert log == [("a", b"head"), ("a", large)]
    await asyncio.sleep(0)
    assert log == [("a", b"head"), ("a", large)]  # the scheduled flush finds nothing more


async def test_it_never_holds_more_than_its_bound() -> None:
    log: list[tuple[str, object]] = []
    box, _ = outbox("a", log)
    piece = b"p" * (HOLD_MAX_BYTES // 4)
    for _ in range(4):
        box.write(piece)
    assert log == []
    assert box.held_bytes == HOLD_MAX_BYTES
    box.write(b"!")  # one byte over: what is held goes, then this
    assert log == [("a", piece * 4), ("a", b"!")]
    assert box.held_bytes == 0


async def test_close_and_half_close_write_what_is_held_first() -> None:
    log: list[tuple[str, object]] = []
    a, _ = outbox("a", log)
    b, _ = outbox("b", log)
    a.write(b"answer")
    a.write_eof()
    b.write(b"last words")
    b.close()
    assert log == [("a", b"answer"), ("a", "eof"), ("b", b"last words"), ("b", "close")]
    await asyncio.sleep(0)
    assert len(log) == 4


async def test_release_writes_what_is_held_and_then_writes_nothing() -> None:
    log: list[tuple[str, object]] = []
    box, recorder = outbox("a", log)
    box.write(b"before the tunnel")
    assert box.release() is cast(asyncio.Transport, recorder)
    assert log == [("a", b"before the tunnel")]
    box.write(b"after")
    await asyncio.sleep(0)
    assert log == [("a", b"before the tunnel")]


async def test_a_transport_closing_meanwhile_gets_nothing() -> None:
    log: list[tuple[str, object]] = []
    box, recorder = outbox("a", log)
    box.write(b"for a peer that left")
    recorder.closing = True  # the peer reset the connection before the pass ended
    await asyncio.sleep(0)
    assert log == []
    assert box.held_bytes == 0


async def test_after_close_or_half_close_nothing_more_is_written() -> None:
    # an upstream answer that arrives after the client connection was half-closed (a later
    # pipelined request was malformed) must not reach a transport that refuses writes after EOF
    log: list[tuple[str, object]] = []
    a, _ = outbox("a", log)
    b, _ = outbox("b", log)
    a.write_eof()
    b.close()
    a.write(b"late")
    b.write(b"late")
    b.write(b"L" * (HOLD_MAX_BYTES + 1))
    await asyncio.sleep(0)
    assert log == [("a", "eof"), ("b", "close")]
    assert a.held_bytes == b.held_bytes == 0


# --- the engine's two sides write through their outboxes (real loopback connections) ---


class AnswerThenClose:
    """A handler that answers, notes what its connection's outbox holds just after, and closes."""

    def __init__(self) -> None:
        self.held_after_write: list[int] = []

    def connection_made(self, conn: ClientConnection) -> None:
        pass

    async def serve(self, conn: ClientConnection, req: Request) -> bool:
        conn.local_response(200, "text/plain", b"the whole answer")
        self.held_after_write.append(conn.outbox.held_bytes)
        return False  # the engine closes: after what is held, never instead of it


async def test_a_client_answer_is_held_then_written_before_the_close() -> None:
    handler = AnswerThenClose()
    async with running(handler, LIMITS) as (_, port):  # read to EOF: the close came after the answer
        answer = await exchange(port, b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith(b"\r\n\r\nthe whole answer")
    assert handler.held_after_write == [len(answer)]


@pytest.mark.parametrize(
    ("body", "held"),
    [
        (b"", "head"),
        (b"small body", "head and body"),  # joined: one segment
        (b"B" * (HOLD_MAX_BYTES + 1), "nothing"),  # the head goes, then the body, at once
    ],
)
async def test_an_upstream_request_is_held_until_the_pass_ends_unless_large(body: bytes, held: str) -> None:
    head = b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(body)
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.put_nowait(await reader.readexactly(len(head) + len(body)))
        writer.close()

    server = await asyncio.start_server(record, "127.0.0.1", 0)
    pool = UpstreamPool(UpstreamConfig(), connect_timeout_s=WAIT_S, read_timeout_s=WAIT_S)
    try:
        port = server.sockets[0].getsockname()[1]
        conn = await pool.connect(parse_absolute_uri(f"http://127.0.0.1:{port}/"))
        conn.start(head, body, Sink(), head_only=False)
        expected = {"head": len(head), "head and body": len(head) + len(body), "nothing": 0}
        assert conn.outbox.held_bytes == expected[held]
        assert await asyncio.wait_for(received.get(), WAIT_S) == head + body
        conn.close()
    finally:
        pool.close()
        server.close()
        await asyncio.wait_for(server.wait_closed(), WAIT_S)
