"""A reload's access rules apply to the requests of an open CONNECT tunnel too: a user removed from
``access.proxy_auth_file`` kept the tunnel it had open signing and forwarding, while a plain
keep-alive connection of the same user was refused (the README: "their next request is checked
against the new rules"). The tunnel's inner requests carry no credentials of their own: the
CONNECT's are checked again."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path

import pytest
from aiohttp import web

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.service.app import ProxyApp
from tests.harness import WAIT_S

pytestmark = pytest.mark.integration


def secret(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: str) -> bytes:
    """One request on an open connection; its status line (the body read by its Content-Length)."""
    writer.write(request.encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    length = next(
        int(v)
        for n, _, v in (line.partition(b":") for line in head.split(b"\r\n"))
        if n.lower() == b"content-length"
    )
    await asyncio.wait_for(reader.readexactly(length), WAIT_S)
    return head.split(b"\r\n", 1)[0]


@pytest.mark.parametrize(
    ("after_reload", "answer", "arrived"),
    [
        ("bob:pw2\n", b"HTTP/1.1 407 Proxy Authentication Required", ["/before"]),  # alice removed
        ("alice:pw1\nbob:pw2\n", b"HTTP/1.1 200 OK", ["/before", "/after"]),  # alice kept
    ],
    ids=["removed", "kept"],
)
async def test_a_reload_s_credentials_apply_inside_an_open_tunnel(
    tmp_path: Path, after_reload: str, answer: bytes, arrived: list[str]
) -> None:
    seen: list[str] = []

    async def origin(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/{name}", origin)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    oport = runner.addresses[0][1]
    secret(tmp_path / "auth", "alice:pw1\n")
    secret(tmp_path / "auth2", after_reload)
    base = {
        "listen": "127.0.0.1:0",
        "data_dir": str(tmp_path / "data"),
        "log": {"access_log": False},
        "access": {"proxy_auth_file": str(tmp_path / "auth")},
        "intercept": {"allowed_ports": [oport]},
    }
    proxy = ProxyApp(parse_config(base), StaticKeyProvider(SigningKey.generate()))
    [(_, port)] = await proxy.start()
    alice = "Basic " + base64.b64encode(b"alice:pw1").decode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        target = f"127.0.0.1:{oport}"
        writer.write(
            f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {alice}\r\n\r\n".encode()
        )
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)).startswith(b"HTTP/1.1 200")
        inside = f"GET /{{}} HTTP/1.1\r\nHost: {target}\r\n\r\n"  # plain HTTP inside the tunnel
        assert await exchange(reader, writer, inside.format("before")) == b"HTTP/1.1 200 OK"
        proxy.reload(parse_config({**base, "access": {"proxy_auth_file": str(tmp_path / "auth2")}}))
        assert await exchange(reader, writer, inside.format("after")) == answer
        assert seen == arrived
    finally:
        writer.close()
        await proxy.stop(0.5)
        await runner.cleanup()
