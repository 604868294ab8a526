"""The publication listener judges a connection when it is accepted, as the admin listener does.

``publish.listen`` faces the public from the proxy's own process, and aiohttp kept every connection
it accepted, without a cap: 400 idle connections from anyone were all held, and enough of them left
the proxy port without a descriptor to accept with.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.config import parse_config
from signing_proxy.service import publish
from signing_proxy.service.publish import PublishServer
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider
from tests.gate_client import Streams, answer, close_all, read_to_end

WAIT_S = 10.0
CAP = 256  # publish.PUBLISH_MAX_CONNECTIONS, spelled out: the cap is part of what this file checks
NOW = 1_800_000_200
DIRECTORY = "/.well-known/http-message-signatures-directory"
GET_DIRECTORY = f"GET {DIRECTORY} HTTP/1.1\r\nHost: agent.example\r\n\r\n".encode()
LAST_GET = GET_DIRECTORY.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")  # answered, then closed


@pytest.fixture
def data(tmp_path: Path) -> Path:
    KeyStore(tmp_path / "data").create(NOW - 200, lifetime_s=10_000)
    return tmp_path / "data"


@asynccontextmanager
async def publish_listener(data: Path, **gate: Any) -> AsyncIterator[int]:
    """A publication listener on 127.0.0.1, port 0: its port; stopped after."""
    config = parse_config(
        {"data_dir": str(data), "publish": {"listen": "127.0.0.1:0", "domain": "agent.example"}}
    )
    watchers = {config.signing.agent: StoreKeyProvider(KeyStore(config.data_path, config.signing.agent))}
    server = PublishServer(config, watchers, clock=lambda: NOW, **gate)
    (_, port), *_ = await server.start()
    try:
        yield port
    finally:
        await server.stop()


async def test_the_listener_still_answers_its_directory(data: Path) -> None:
    async with publish_listener(data) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(GET_DIRECTORY)
            head, body = await answer(reader)
        finally:
            close_all([(reader, writer)])
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"\r\nContent-Type: application/jwk-set+json\r\n" in head
    assert b"\r\nServer: signing-proxy\r\n" in head
    assert len(json.loads(body)["keys"]) == 1


async def test_past_the_cap_a_connection_is_closed_unanswered_while_earlier_ones_are_served(
    data: Path,
) -> None:
    async with publish_listener(data) as port:
        held: list[Streams] = []
        try:
            for _ in range(CAP):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                held.append((reader, writer))
                writer.write(GET_DIRECTORY)
                assert (await answer(reader))[0].startswith(b"HTTP/1.1 200 ")  # admitted, kept alive
            extra = await asyncio.open_connection("127.0.0.1", port)
            held.append(extra)
            extra[1].write(LAST_GET)
            assert await read_to_end(extra[0]) == b""  # closed unanswered
            reader, writer = held[CAP - 1]  # an admitted one (the latest: its keep-alive is freshest)
            writer.write(GET_DIRECTORY)
            head, body = await answer(reader)
            assert head.startswith(b"HTTP/1.1 200 ")
            assert len(json.loads(body)["keys"]) == 1
        finally:
            close_all(held)


async def test_a_connection_that_sends_no_head_in_time_is_closed(data: Path) -> None:
    async with publish_listener(data, idle_s=0.2) as port:
        silent, partial, served = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        try:
            partial[1].write(f"GET {DIRECTORY} HTTP/1.1\r\nHost: agent.example\r\n".encode())  # never ends
            served[1].write(GET_DIRECTORY)  # answered, then kept alive with no second request
            assert (await answer(served[0]))[0].startswith(b"HTTP/1.1 200 ")
            for reader, _ in (silent, partial, served):
                assert b"HTTP/" not in await read_to_end(reader)  # closed, nothing (more) answered
        finally:
            close_all([silent, partial, served])


async def test_a_smaller_cap_given_holds_too(data: Path) -> None:
    async with publish_listener(data, max_connections=2) as port:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        try:
            for reader, writer in held:
                writer.write(GET_DIRECTORY)
                assert (await answer(reader))[0].startswith(b"HTTP/1.1 200 ")
            extra = await asyncio.open_connection("127.0.0.1", port)
            held.append(extra)
            extra[1].write(LAST_GET)
            assert await read_to_end(extra[0]) == b""  # closed unanswered
        finally:
            close_all(held)


def test_the_bounds_are_the_ones_checked_and_documented() -> None:
    assert publish.PUBLISH_MAX_CONNECTIONS == CAP
    assert publish.PUBLISH_IDLE_S == 10.0
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    idle = publish.PUBLISH_IDLE_S
    assert f"cap connections at {CAP} and close any that sends no request head within {idle:g} s" in readme
