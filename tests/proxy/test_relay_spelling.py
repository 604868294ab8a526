"""A relay sends on the target as received wherever the request came from, and every component it
derives from the target agrees with what it sends (RFC 9421 sections 2.2.2 and 2.2.5).

Each test signs as a third party does (pyauth, ``http-message-signatures``: its components are the
URI exactly as given) for a path with an empty query, ``/x?``, which our normal form writes ``/x``.
The origin verifies every label with our verifier and with pyauth.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from signing_proxy.config import parse_config
from signing_proxy.core.digest import content_digest
from signing_proxy.core.keys import DirectoryKey, StaticKeyProvider
from signing_proxy.service.app import ProxyApp
from tests.harness import WAIT_S, VerifyingOrigin
from tests.oracle import oracle_sign
from tests.proxy.test_relay import AGENT, RELAY, DirectoryHost

pytestmark = pytest.mark.integration

BODY = b'{"ver":"1.0"}'


@asynccontextmanager
async def relay(
    tmp_path: Path, extra: Callable[[VerifyingOrigin], dict[str, Any]]
) -> AsyncIterator[tuple[int, VerifyingOrigin, str]]:
    """A relay on 127.0.0.1 (``extra``: more of its configuration, given the origin) that resolves the
    agent's key from a directory on loopback; its port, the origin and the directory's base."""
    host = DirectoryHost()
    now = int(time.time())
    host.keys = [DirectoryKey(AGENT.public, now - 60, now + 3600)]
    directory = web.Application()
    directory.router.add_get("/.well-known/http-message-signatures-directory", host.directory)
    directory.router.add_get("/revoked.json", host.revocations)
    async with TestServer(directory, host="127.0.0.1") as served:
        host.base = f"http://127.0.0.1:{served.port}"
        with VerifyingOrigin() as origin:
            origin.trust(AGENT, RELAY)
            config = {
                "mode": "relay",
                "listen": "127.0.0.1:0",
                "data_dir": str(tmp_path),
                "signing": {"label": "broker"},
                "egress": {"allow_private": ["127.0.0.1/32"]},
                "log": {"access_log": False},
                **extra(origin),
            }
            app = ProxyApp(parse_config(config), StaticKeyProvider(RELAY))
            (_, port), *_ = await app.start()
            try:
                yield port, origin, host.base
            finally:
                await app.stop(drain_s=1)


async def exchange(port: int, raw: bytes, *, tunnel_to: int | None = None) -> bytes:
    """``raw`` to the relay on its own connection (inside a CONNECT tunnel to ``tunnel_to``, plain
    HTTP within it, when given); the whole answer."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
    try:
        if tunnel_to is not None:
            writer.write(
                f"CONNECT 127.0.0.1:{tunnel_to} HTTP/1.1\r\nHost: 127.0.0.1:{tunnel_to}\r\n\r\n".encode()
            )
            established = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
            assert established.startswith(b"HTTP/1.1 200"), established
        writer.write(raw)
        return await asyncio.wait_for(reader.read(), WAIT_S)
    finally:
        writer.close()


def request(method: str, request_target: str, host: str, lines: list[tuple[str, str]], body: bytes) -> bytes:
    head = f"{method} {request_target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
    head += f"Content-Length: {len(body)}\r\n" if body else ""
    return (head + "".join(f"{n}: {v}\r\n" for n, v in lines) + "\r\n").encode() + body


async def test_inside_a_tunnel_the_relay_sends_on_the_target_as_received(tmp_path: Path) -> None:
    """``HTTPS_PROXY`` traffic reaches a relay through CONNECT: the target inside the tunnel was
    rebuilt in the normal form, so the relay refused ``bad-signature`` what it forwards in absolute
    form."""
    async with relay(tmp_path, lambda origin: {"intercept": {"allowed_ports": [origin.port]}}) as (
        port,
        origin,
        base,
    ):
        url = origin.url("/x?")
        lines = [
            ("Content-Digest", content_digest(BODY)),
            ("Authorization", ""),
            ("Signature-Agent", f'"{base}"'),
        ]
        signed = oracle_sign(
            "POST", url, lines, BODY, keyid=AGENT.thumbprint, private_key=AGENT._private, now=int(time.time())
        )
        answer = await exchange(
            port, request("POST", "/x?", f"127.0.0.1:{origin.port}", signed, BODY), tunnel_to=origin.port
        )
    assert answer.startswith(b"HTTP/1.1 200"), answer
    (arrival,) = origin.arrivals
    assert arrival.target_uri == url
    assert (arrival.verified, arrival.oracle, arrival.labels) == (True, "ok", ["agent", "broker"])


@pytest.mark.parametrize("path", ["/x?", "/x?a=1"], ids=["empty-query", "query"])
async def test_request_target_is_the_one_sent(tmp_path: Path, path: str) -> None:
    """A web-bot-auth label may cover ``@request-target``, and the relay's label covers what the
    agent's does. It was written in the normal form (``/x``) while ``/x?`` went out: the relay refused
    the agent's label, and signed its own over a request target the origin did not receive."""
    async with relay(tmp_path, lambda _origin: {"profiles": {"default": "web-bot-auth"}}) as (
        port,
        origin,
        base,
    ):
        url = origin.url(path)
        signed = oracle_sign(
            "GET",
            url,
            [("Signature-Agent", f'"{base}"')],
            b"",
            keyid=AGENT.thumbprint,
            private_key=AGENT._private,
            now=int(time.time()),
            components=("@authority", "@request-target", "signature-agent"),
            tag="web-bot-auth",
        )
        answer = await exchange(port, request("GET", url, "x", signed, b""))
    assert answer.startswith(b"HTTP/1.1 200"), answer
    (arrival,) = origin.arrivals
    assert arrival.target_uri == url
    assert (arrival.verified, arrival.oracle, arrival.labels) == (True, "ok", ["agent", "broker"])


async def test_a_relays_route_sends_on_the_request_target_as_received(tmp_path: Path) -> None:
    """A relay's sidecar route (``/up/`` to the origin) keeps the rest of the request target as it
    came, ``x?`` included, as its absolute-form and tunnelled requests do."""
    async with relay(
        tmp_path, lambda origin: {"routes": [{"prefix": "/up/", "upstream": origin.url("/")}]}
    ) as (
        port,
        origin,
        base,
    ):
        url = origin.url("/x?")  # where the route sends it: what the agent signs
        lines = [
            ("Content-Digest", content_digest(BODY)),
            ("Authorization", ""),
            ("Signature-Agent", f'"{base}"'),
        ]
        signed = oracle_sign(
            "POST", url, lines, BODY, keyid=AGENT.thumbprint, private_key=AGENT._private, now=int(time.time())
        )
        answer = await exchange(port, request("POST", "/up/x?", f"127.0.0.1:{port}", signed, BODY))
    assert answer.startswith(b"HTTP/1.1 200"), answer
    (arrival,) = origin.arrivals
    assert arrival.target_uri == url
    assert (arrival.verified, arrival.oracle, arrival.labels) == (True, "ok", ["agent", "broker"])
