"""A CONNECT whose leaf cannot be minted for want of file descriptors is a 503, not a 500.

A new host's leaf reaches OpenSSL through a memfd (or a temp file); a process out of descriptors
gets ``OSError(EMFILE)`` there, which is no ``CAError`` and was answered ``500 internal-error`` as if
the proxy were broken. It is ``503 server-busy`` with ``Retry-After``, like a full proxy: nothing is
left behind, and the next CONNECT to the host is intercepted as usual.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.net import leaves
from signing_proxy.service.app import ProxyApp
from tests.harness import WAIT_S

KEY = SigningKey.generate()
HOST = "fresh.example"


async def connect(port: int) -> tuple[bytes, bytes]:
    """CONNECT HOST: the answer's head and (to the proxy's close, or nothing after a 200) its body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"CONNECT {HOST}:443 HTTP/1.1\r\nHost: {HOST}:443\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        body = b"" if head.startswith(b"HTTP/1.1 200 ") else await asyncio.wait_for(reader.read(), WAIT_S)
        return head, body
    finally:
        writer.close()
        await writer.wait_closed()


async def scenario(tmp: Path, exhausted: list[bool]) -> None:
    config = parse_config({"listen": "127.0.0.1:0", "data_dir": str(tmp / "data")})
    app = ProxyApp(config, StaticKeyProvider(KEY))
    [(_host, port)] = await app.start()
    try:
        head, body = await connect(port)
        assert head.startswith(b"HTTP/1.1 503 "), head
        assert b"\r\nretry-after: 1\r\n" in head.lower()
        assert json.loads(body)["reason"] == "server-busy"
        assert app.interception.leaves is not None
        assert HOST not in app.interception.leaves

        exhausted[0] = False  # descriptors free again
        head, _ = await connect(port)
        assert head.startswith(b"HTTP/1.1 200 Connection Established"), head
        assert HOST in app.interception.leaves
    finally:
        await app.stop()


def test_a_leaf_that_cannot_get_a_descriptor_is_503_and_the_next_connect_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exhausted = [True]
    real = leaves._PemPaths.temporary

    def temporary(self: leaves._PemPaths, data: bytes) -> AbstractContextManager[str]:
        if exhausted[0]:  # memfd_create(2) or mkstemp(3) in a process at its RLIMIT_NOFILE
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(self, data)

    monkeypatch.setattr(leaves._PemPaths, "temporary", temporary)
    asyncio.run(scenario(tmp_path, exhausted))
