"""The admin listener judges a connection when it is accepted, not once a request head arrived.

aiohttp waited for a first request without limit, and ``admin.allow_clients`` was checked only on
a whole head: any peer that could reach an off-loopback admin port held file descriptors for as
long as it liked (150 idle connections under RLIMIT_NOFILE 128 left the proxy port resetting).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from signing_proxy.service import admin_app
from signing_proxy.service.admin_app import build_admin_app, start_admin_listener
from tests.gate_client import Streams, answer_head, close_all, read_to_end

WAIT_S = 10.0
CAP = 64  # admin_app.ADMIN_MAX_CONNECTIONS, spelled out: the cap is part of what this file checks
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n"


def _ready() -> tuple[int, dict[str, object]]:
    return 200, {"status": "ready"}


@asynccontextmanager
async def admin_listener(
    allow_clients: Sequence[str] = (), **options: Any
) -> AsyncIterator[tuple[web.AppRunner, int]]:
    app = build_admin_app(_ready, lambda: b"", allow_clients=allow_clients)
    runner, (_, port) = await start_admin_listener(app, "127.0.0.1", 0, reuse_port=False, **options)
    try:
        yield runner, port
    finally:
        await runner.cleanup()


async def test_a_client_outside_allow_clients_is_refused_before_it_sends_anything() -> None:
    async with admin_listener(allow_clients=["10.0.0.0/8"]) as (runner, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            answer = await read_to_end(reader)  # nothing sent: the 403 and the close come anyway
        finally:
            close_all([(reader, writer)])
        assert runner.server is not None
        assert runner.server.connections == []  # aiohttp never had it
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403 ")
    assert b"application/problem+json" in head
    assert json.loads(body)["reason"] == "client-not-allowed"


async def test_an_allowed_client_is_still_served() -> None:
    async with admin_listener(allow_clients=["127.0.0.0/8"]) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
            answer = await read_to_end(reader)
        finally:
            close_all([(reader, writer)])
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b'"status": "ok"' in answer


async def test_connections_that_send_no_head_in_time_are_closed() -> None:
    async with admin_listener(idle_s=0.3) as (_, port):
        silent, partial, served = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        try:
            partial[1].write(b"GET /healthz HTTP/1.1\r\nHost: admin\r\n")  # the head never ends
            served[1].write(HEALTHZ)  # answered, then kept alive with no second request
            assert (await answer_head(served[0])).startswith(b"HTTP/1.1 200 ")
            for reader, _ in (silent, partial, served):
                assert b"HTTP/" not in await read_to_end(reader)  # closed, nothing (more) answered
        finally:
            close_all([silent, partial, served])


async def test_connections_beyond_the_cap_are_closed_at_once() -> None:
    async with admin_listener() as (_, port):
        held: list[Streams] = []
        try:
            for _ in range(CAP):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                held.append((reader, writer))
                writer.write(HEALTHZ)
                assert (await answer_head(reader)).startswith(b"HTTP/1.1 200 ")  # admitted, kept alive
            extra = await asyncio.open_connection("127.0.0.1", port)
            held.append(extra)
            extra[1].write(HEALTHZ)
            assert await read_to_end(extra[0]) == b""  # closed unanswered
            reader, writer = held[0]
            writer.write(HEALTHZ)  # those admitted are still served
            assert (await answer_head(reader)).startswith(b"HTTP/1.1 200 ")
        finally:
            close_all(held)


def test_the_cap_is_the_one_checked_here() -> None:
    assert admin_app.ADMIN_MAX_CONNECTIONS == CAP


async def test_strangers_never_fill_the_admitted_connections_cap() -> None:
    """The cap counted refused connections (each kept up to a second while its 403 left): a stranger
    connecting ~64 times a second kept it full, and allowed probes were closed unanswered."""
    async with admin_listener(allow_clients=["127.0.0.2/32"]) as (_, port):
        strangers: list[Streams] = []
        try:
            for _ in range(CAP + 8):  # from 127.0.0.1: refused, lingering
                strangers.append(await asyncio.open_connection("127.0.0.1", port))
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
            strangers.append((reader, writer))
            writer.write(HEALTHZ)
            assert (await answer_head(reader)).startswith(b"HTTP/1.1 200 ")
        finally:
            close_all(strangers)
