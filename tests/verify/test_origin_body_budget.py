"""``verify-origin`` holds bodies whole to digest them: at most ``MAX_BODY_BYTES`` each, and now at
most ``max_held_bytes`` of them at once (the proxy's ``limits.max_buffered_bytes``). Without the
second bound 256 connections, each one byte short of 10 MiB, held 2.5 GB; past it a request is
answered ``503 server-busy`` with ``Retry-After`` before its body is read."""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp.test_utils import TestServer

from signing_proxy.config import LimitsConfig
from signing_proxy.core.jwk import SigningKey
from signing_proxy.verify import VerifierPolicy, build_verify_origin
from signing_proxy.verify.origin import MAX_HELD_BYTES
from tests.harness import WAIT_S
from tests.oracle import oracle_agent_sign

AGENT = SigningKey.generate()


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


async def test_bodies_past_the_budget_are_refused_unread_while_others_are_held() -> None:
    policy = VerifierPolicy(pinned_agent_keys=(AGENT.public,))
    async with TestServer(build_verify_origin(policy, max_held_bytes=1000), host="127.0.0.1") as server:
        port = server.port
        assert port is not None
        url = f"http://127.0.0.1:{port}/upload"
        body = b"x" * 800
        signed = oracle_agent_sign("POST", url, body, AGENT, signature_agent="")
        head = f"POST /upload HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{n}: {v}\r\n" for n, v in signed) + "\r\n"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head.encode() + body[:-1])  # held: one byte short
        other = b"POST /other HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 300\r\n\r\n"
        deadline = time.monotonic() + WAIT_S
        while True:  # until the first request's handler has reserved its 800 bytes
            status, fields = await answer(port, other, b"y" * 300)
            if status == 503 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert (status, json.loads(fields["body"])["reason"]) == (503, "server-busy"), fields
        assert fields["retry-after"] == "1"
        writer.write(body[-1:])  # the held request completes and is judged
        first = await asyncio.wait_for(reader.readline(), WAIT_S)
        writer.close()
        assert first.startswith(b"HTTP/1.1 200"), first
        status, _ = await answer(port, other, b"y" * 300)  # its bytes given back
        assert status == 401


def test_the_default_budget_is_the_proxys() -> None:
    assert LimitsConfig.max_buffered_bytes == MAX_HELD_BYTES
