"""``verify-origin`` holds bodies whole to digest them: at most ``MAX_BODY_BYTES`` each, and now at
most ``max_held_bytes`` of them at once (the proxy's ``limits.max_buffered_bytes``), charged as they
arrive. Without the second bound 256 connections, each one byte short of 10 MiB, held 2.5 GB; past
it a request is answered ``503 server-busy`` with ``Retry-After``. Reserved from ``Content-Length``
before a byte came, strangers' heads alone held the budget: now a head holds nothing."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp.test_utils import TestServer

from signing_proxy.config import LimitsConfig
from signing_proxy.core.jwk import SigningKey
from signing_proxy.verify import VerifierPolicy, build_verify_origin
from signing_proxy.verify import origin as origin_module
from signing_proxy.verify.origin import MAX_HELD_BYTES
from tests.harness import WAIT_S
from tests.oracle import oracle_agent_sign

AGENT = SigningKey.generate()


def signed_head(port: int, path: str, body: bytes) -> bytes:
    """A request head for ``path`` carrying the agent's signature over ``body`` (pinned key)."""
    signed = oracle_agent_sign("POST", f"http://127.0.0.1:{port}{path}", body, AGENT, signature_agent="")
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {len(body)}\r\n"
    return (head + "".join(f"{n}: {v}\r\n" for n, v in signed) + "\r\n").encode()


async def answer(port: int, head: bytes, body: bytes = b"") -> tuple[int, dict[str, str]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        status_line = await asyncio.wait_for(reader.readline(), WAIT_S)
        fields = {}
        while (line := await asyncio.wait_for(reader.readline(), WAIT_S)) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            fields[name.strip().lower()] = value.strip()
        if "content-length" in fields:
            fields["body"] = (await reader.readexactly(int(fields["content-length"]))).decode()
        return int(status_line.split()[1]), fields
    finally:
        writer.close()


def origin(max_held_bytes: int, body_silence_s: float = WAIT_S) -> TestServer:
    policy = VerifierPolicy(pinned_agent_keys=(AGENT.public,))
    app = build_verify_origin(policy, max_held_bytes=max_held_bytes, body_silence_s=body_silence_s)
    return TestServer(app, host="127.0.0.1")


async def test_bodies_past_the_budget_are_refused_while_others_are_held() -> None:
    async with origin(1000) as server:
        port = server.port
        assert port is not None
        body = b"x" * 800
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(signed_head(port, "/upload", body) + body[:-1])  # held: one byte short
        other = b"y" * 300
        deadline = time.monotonic() + WAIT_S
        while True:  # until the first request's 799 bytes are held
            status, fields = await answer(port, signed_head(port, "/other", other), other)
            if status == 503 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert (status, json.loads(fields["body"])["reason"]) == (503, "server-busy"), fields
        assert fields["retry-after"] == "1"
        writer.write(body[-1:])  # the held request completes and is judged
        first = await asyncio.wait_for(reader.readline(), WAIT_S)
        writer.close()
        assert first.startswith(b"HTTP/1.1 200"), first
        status, _ = await answer(port, signed_head(port, "/other", other), other)  # given back
        assert status == 200


async def test_a_head_alone_holds_nothing_of_the_budget() -> None:
    async with origin(1000) as server:
        port = server.port
        assert port is not None
        heads = []
        for _ in range(5):  # 5 x 800 declared, with a signature to check: none of the body sent
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(signed_head(port, "/x", b"z" * 800))
            await writer.drain()
            heads.append(writer)
        await asyncio.sleep(0.2)  # the server's loop is this one: it reads the heads meanwhile
        other = b"y" * 300
        status, fields = await answer(port, signed_head(port, "/other", other), other)
        for writer in heads:
            writer.close()
    assert status == 200, fields


async def test_a_body_stopped_short_gives_its_bytes_back_after_its_silence() -> None:
    """A body that stopped short of its end held its bytes for as long as its socket stayed open:
    13 of them, about 128 MiB sent once, locked every body out. Silent ``body_silence_s``, it is
    answered 408 and its bytes are given back."""
    async with origin(1000, body_silence_s=0.3) as server:
        port = server.port
        assert port is not None
        body = b"x" * 800
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(signed_head(port, "/upload", body) + body[:-1])  # and nothing more
        status_line = await asyncio.wait_for(reader.readline(), WAIT_S)
        assert status_line.startswith(b"HTTP/1.1 408"), status_line
        writer.close()
        other = b"y" * 300
        status, fields = await answer(port, signed_head(port, "/other", other), other)
    assert status == 200, fields


def test_the_default_budget_is_the_proxys() -> None:
    assert LimitsConfig.max_buffered_bytes == MAX_HELD_BYTES


async def test_a_body_past_max_body_bytes_is_413_whatever_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The body is read chunk by chunk, not by aiohttp's ``request.read()``: its ``client_max_size``
    no longer applies, and this bound is the only one on a single body."""
    monkeypatch.setattr(origin_module, "MAX_BODY_BYTES", 500)
    async with origin(1 << 20) as server:
        port = server.port
        assert port is not None
        large, small = b"x" * 501, b"y" * 500
        status, fields = await answer(port, signed_head(port, "/large", large), large)
        assert status == 413, fields
        status, fields = await answer(port, signed_head(port, "/small", small), small)
    assert status == 200, fields
