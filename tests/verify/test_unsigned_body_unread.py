"""A request with no signature stack is refused before its body is read: the verifying faces held
a whole body (verify-origin up to 64 MiB per connection) before a check that needs none of it."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestServer

from signing_proxy.verify import VerifierPolicy
from signing_proxy.verify.origin import build_verify_origin

WAIT_S = 10.0


async def test_an_unsigned_request_is_refused_before_its_body_arrives() -> None:
    server = TestServer(build_verify_origin(VerifierPolicy()))
    await server.start_server()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(
            b"POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 8000000\r\n\r\n" + b"x" * 1000
        )  # 8 MB announced, a thousand bytes sent: the answer must not wait for the rest
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        assert head.startswith(b"HTTP/1.1 401 ")
        writer.close()
    finally:
        await server.close()
