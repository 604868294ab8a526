"""``limits.max_buffered_bytes`` is charged by body bytes as they arrive; a declared
``Content-Length`` is checked against it, never reserved.

Reserved at the head, the budget was held by heads alone: a stranger sending a dozen heads that
declare 10 MiB each and no body (at the gateway, which faces anyone) had every other body answered
``503 server-busy`` for as long as it kept them open. Concurrent uploads still never pass the budget
together: each chunk is charged before it is kept.
"""

from __future__ import annotations

import asyncio

from signing_proxy.net.request import Limits, Request
from signing_proxy.net.server import ClientConnection
from tests.harness import WAIT_S
from tests.net.test_engine import body_or_refused, running

HEAD = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 60\r\nConnection: close\r\n\r\n"
LIMITS = Limits(max_header_bytes=4096, max_body_bytes=64, client_idle_s=5, read_s=5, max_buffered_bytes=100)


class Reading:
    """Reads each request's body and answers with its length; ``entered`` counts requests begun."""

    def __init__(self) -> None:
        self.entered = 0
        self.two_in = asyncio.Event()

    def connection_made(self, conn: ClientConnection) -> None:
        pass

    async def serve(self, conn: ClientConnection, req: Request) -> bool:
        self.entered += 1
        if self.entered == 2:
            self.two_in.set()
        body = await body_or_refused(conn, req)
        if body is None:
            return False
        conn.local_response(200, "text/plain", str(len(body)).encode())
        return conn.keep_alive


async def test_heads_without_their_bodies_hold_nothing_of_the_budget() -> None:
    handler = Reading()
    async with running(handler, LIMITS) as (engine, port):
        waiting = []
        for _ in range(2):  # 2 x 60 declared: more than the budget, none of it sent
            _reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
            writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 60\r\n\r\n")
            waiting.append(writer)
        await asyncio.wait_for(handler.two_in.wait(), WAIT_S)
        assert engine.buffered == 0
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
        writer.write(HEAD + b"a" * 60)
        answer = await asyncio.wait_for(reader.read(-1), WAIT_S)
        for w in (*waiting, writer):
            w.close()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert answer.endswith(b"\r\n\r\n60")


async def test_bodies_arriving_together_never_pass_the_budget() -> None:
    handler = Reading()
    async with running(handler, LIMITS) as (engine, port):
        opened = [await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S) for _ in "ab"]
        for _reader, writer in opened:
            writer.write(HEAD)
        await asyncio.wait_for(handler.two_in.wait(), WAIT_S)  # both declared 60 before a byte came
        for _reader, writer in opened:
            writer.write(b"a" * 60)
        answers = [await asyncio.wait_for(reader.read(-1), WAIT_S) for reader, _writer in opened]
        for _reader, writer in opened:
            writer.close()
        assert engine.buffered == 0  # every byte charged was given back
    statuses = sorted(answer.split(b" ", 2)[1] for answer in answers)
    assert statuses == [b"200", b"503"], answers  # one fits; the other's bytes would pass it


async def test_a_head_declaring_more_than_the_budget_left_is_answered_503_at_once() -> None:
    """Not after ``read_s`` waiting for a body that could not be kept: the declared length is checked
    as the head completes."""
    limits = Limits(
        max_header_bytes=4096, max_body_bytes=200, client_idle_s=5, read_s=5, max_buffered_bytes=100
    )
    async with running(Reading(), limits) as (engine, port):
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n")  # no body yet
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 1.0)  # under read_s
        writer.close()
        assert engine.buffered == 0
    assert head.startswith(b"HTTP/1.1 503 "), head
