"""``timeouts.read_s`` bounds a silence of the client's body, not its whole upload: a body that keeps
arriving is waited for however long it takes (nginx's ``client_body_timeout``), and one that stops
for ``read_s`` is answered ``408 request-timeout``. The whole upload was held to one ``read_s``: an
upload of 10 MiB slower than ~175 KB/s was refused at the default 60 s while its bytes arrived."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from signing_proxy.net.request import Limits

from .test_engine import LIMITS, Echo, running

READ_S = 1.0  # a silence this long ends the body
WAIT_S = 10.0


async def _send_and_answer(port: int, head: bytes, pieces: list[bytes], gap_s: float) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        for piece in pieces:
            await asyncio.sleep(gap_s)  # the client's own pace: the gap between its writes is the test
            writer.write(piece)
            await writer.drain()
        return await asyncio.wait_for(reader.read(), WAIT_S)
    finally:
        writer.close()


def _limits() -> Limits:
    return dataclasses.replace(LIMITS, read_s=READ_S)


async def test_a_body_that_keeps_arriving_past_read_s_in_all_is_served() -> None:
    pieces = [b"ab"] * 8  # 16 bytes, one piece every READ_S / 4: ~2 s in all, twice READ_S
    head = b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 16\r\nConnection: close\r\n\r\n"
    async with running(Echo(), _limits()) as (_engine, port):
        answer = await _send_and_answer(port, head, pieces, READ_S / 4)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert answer.endswith(b"POST /up " + b"ab" * 8)


async def test_a_body_that_stops_for_read_s_is_408_request_timeout() -> None:
    head = b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 16\r\n\r\n"
    async with running(Echo(), _limits()) as (_engine, port):
        answer = await _send_and_answer(port, head, [b"ab"], 0.0)  # 2 of 16 bytes, then nothing
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    problem = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert problem["reason"] == "request-timeout"
    assert "timeouts.read_s" in problem["detail"]
