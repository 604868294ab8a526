"""``signing-proxy verify-origin`` judges a connection when it is accepted, as the admin listener does.

aiohttp kept every connection it accepted, without a cap: whoever reached ``--listen`` held as many
file descriptors as it opened, idle, for aiohttp's 75 s keep-alive timeout each.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

from signing_proxy.cli import verify_origin
from signing_proxy.net.egress import EgressPolicy
from signing_proxy.verify import VerifierPolicy
from tests.gate_client import answer_head, close_all, read_to_end
from tests.harness import WAIT_S, started

CAP = 256  # verify_origin.VERIFY_ORIGIN_MAX_CONNECTIONS, spelled out: the cap is what this file checks
GET = b"GET /hello HTTP/1.1\r\nHost: origin.example\r\n\r\n"  # unsigned: a 401 verdict
LAST_GET = GET.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")  # answered, then closed


def _answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """One whole answer read from a blocking socket (its body too): its head and its body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole head: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed before a whole body"
        body += chunk
    return head, body


def _to_end(sock: socket.socket) -> bytes:
    """What arrives until the listener closes (a reset reads as the end too)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_past_the_cap_a_connection_is_closed_unanswered_while_earlier_ones_are_served() -> None:
    with started("verify-origin", "--listen", "127.0.0.1:0", until="listening on") as lines:
        port = int(lines[-1].rsplit(":", 1)[1])
        held: list[socket.socket] = []
        try:
            for _ in range(CAP):
                sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
                held.append(sock)
                sock.sendall(GET)
                assert _answer(sock)[0].startswith(b"HTTP/1.1 401 ")  # admitted, kept alive
            extra = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
            held.append(extra)
            with suppress(OSError):  # it may be closed already
                extra.sendall(LAST_GET)
            assert _to_end(extra) == b""  # closed unanswered
            sock = held[CAP - 1]  # an admitted one (the latest: its keep-alive is freshest)
            sock.sendall(GET)
            head, body = _answer(sock)
            assert head.startswith(b"HTTP/1.1 401 ")
            assert json.loads(body)["verified"] is False
        finally:
            for sock in held:
                sock.close()


@asynccontextmanager
async def origin(**gate: Any) -> AsyncIterator[int]:
    """verify-origin's listener in this process, on 127.0.0.1 port 0: its port; stopped after."""
    runner, (_, port) = await verify_origin.start_verify_origin(
        "127.0.0.1", 0, VerifierPolicy(), None, EgressPolicy(()), **gate
    )
    try:
        yield port
    finally:
        await runner.cleanup()


async def test_the_origin_still_answers_its_verdict() -> None:
    async with origin() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(LAST_GET)
            answer = await read_to_end(reader)
        finally:
            close_all([(reader, writer)])
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401 ")
    assert b"\r\nContent-Type: application/problem+json" in head
    verdict = json.loads(body)
    assert verdict["verified"] is False
    assert verdict["path"] == "/hello"


async def test_a_connection_that_sends_no_head_in_time_is_closed() -> None:
    async with origin(idle_s=0.2) as port:
        silent, partial, served = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        try:
            partial[1].write(b"GET /hello HTTP/1.1\r\nHost: origin.example\r\n")  # the head never ends
            served[1].write(GET)  # answered, then kept alive with no second request
            assert (await answer_head(served[0])).startswith(b"HTTP/1.1 401 ")
            for reader, _ in (silent, partial, served):
                assert b"HTTP/" not in await read_to_end(reader)  # closed, nothing (more) answered
        finally:
            close_all([silent, partial, served])


async def test_a_smaller_cap_given_holds_too() -> None:
    async with origin(max_connections=2) as port:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        try:
            for reader, writer in held:
                writer.write(GET)
                assert (await answer_head(reader)).startswith(b"HTTP/1.1 401 ")
            extra = await asyncio.open_connection("127.0.0.1", port)
            held.append(extra)
            extra[1].write(LAST_GET)
            assert await read_to_end(extra[0]) == b""  # closed unanswered
        finally:
            close_all(held)


def test_the_bounds_are_the_ones_checked_and_documented() -> None:
    assert verify_origin.VERIFY_ORIGIN_MAX_CONNECTIONS == CAP
    assert verify_origin.VERIFY_ORIGIN_IDLE_S == 10.0
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    idle = verify_origin.VERIFY_ORIGIN_IDLE_S
    assert f"cap connections at {CAP} and close any that sends no request head within {idle:g} s" in readme
