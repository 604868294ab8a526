"""A client that ends its stream inside the TLS handshake of an intercepted CONNECT: the log says so.

A client's FIN reaches OpenSSL as the end of its input, and ``do_handshake`` raises
``SSLZeroReturnError`` (or ``SSLEOFError``); that was reported as a TLS failure ("TLS/SSL connection
has been closed (EOF)"), a generic warning, so the two lines meant for it never appeared: the
info line for a client gone inside its ClientHello, and the warning with the CA install hint for
one that left after our certificate (as a client does that does not trust our CA and sends no
alert). Ending the stream is leaving: it is reported as the closed connection it is.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.proxy.connect import CA_INSTALL_HINT
from signing_proxy.service.app import ProxyApp
from tests.harness import WAIT_S
from tests.proxy.raw_upstream import loop_factories

KEY = SigningKey.generate()
HOST = "shop.example"


def client_hello() -> bytes:
    """The first flight of a TLS client for HOST (any trust store: it never gets further here)."""
    outgoing = ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=HOST)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


async def connect_then(port: int, how: str) -> None:
    """CONNECT HOST, send half a ClientHello or all of it (then wait for our answer), then half-close
    and read to the proxy's close: by then the handshake's failure has been reported."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"CONNECT {HOST}:443 HTTP/1.1\r\nHost: {HOST}:443\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        assert head.startswith(b"HTTP/1.1 200 ")
        hello = client_hello()
        if how == "mid-hello":
            writer.write(hello[: len(hello) // 2])
        else:
            writer.write(hello)
            assert await asyncio.wait_for(reader.read(1), WAIT_S)  # our ServerHello and certificate
        writer.write_eof()
        while await asyncio.wait_for(reader.read(65536), WAIT_S):
            pass
    finally:
        writer.close()
        await writer.wait_closed()


async def scenario(tmp: Path, how: str) -> None:
    config = parse_config(
        {"listen": "127.0.0.1:0", "data_dir": str(tmp / "data"), "log": {"access_log": False}}
    )
    app = ProxyApp(config, StaticKeyProvider(KEY))
    [(_host, port)] = await app.start()
    try:
        await connect_then(port, how)
    finally:
        await app.stop()


@pytest.mark.parametrize("loop_factory", loop_factories())
@pytest.mark.parametrize("how", ["mid-hello", "after-certificate"])
def test_a_client_that_ends_its_stream_in_the_handshake_is_logged_as_leaving(
    loop_factory: Any, how: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.INFO, logger="signing_proxy"),
        asyncio.Runner(loop_factory=loop_factory) as runner,
    ):
        runner.run(scenario(tmp_path, how))
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "signing_proxy.proxy.connect"]
    assert not any("EOF" in message for _, message in lines), lines
    if how == "mid-hello":
        assert (
            logging.INFO,
            f"CONNECT {HOST}:443 from 127.0.0.1: the client closed the connection inside its ClientHello",
        ) in lines
    else:
        hinted = [m for level, m in lines if level == logging.WARNING and CA_INSTALL_HINT in m]
        assert len(hinted) == 1, lines
        assert "the client closed the connection" in hinted[0]
