"""WebSockets through the proxy (RFC 6455): the handshake is signed like any request, then frames flow
unchanged both ways. Plain ``ws://`` through ``HTTP_PROXY`` (absolute form) and ``wss://`` inside an
intercepted CONNECT; a refused handshake is relayed; other upgrades stay refused with a reason."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from signing_proxy.core.jwk import SigningKey
from signing_proxy.net.leaves import LeafContextCache
from signing_proxy.storage.ca import CertificateAuthority
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, wait_for
from tests.proxy.raw_upstream import websocket_handshake

KEY = SigningKey.generate()
ROOT = Path(__file__).resolve().parents[2]


async def echo(request: web.Request) -> web.StreamResponse:
    if request.path == "/refuse":
        return web.Response(status=403, text="no sockets for you")
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    async for message in ws:
        if message.type == aiohttp.WSMsgType.TEXT:
            await ws.send_str("echo:" + message.data)
        elif message.type == aiohttp.WSMsgType.BINARY:
            await ws.send_bytes(message.data[::-1])
    return ws


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("pki")
    origin_ca = CertificateAuthority.generate()
    (tmp / "origin-ca.pem").write_bytes(origin_ca.cert_pem())
    with LeafContextCache(origin_ca, 4) as leaves:
        yield {"ca_file": tmp / "origin-ca.pem", "tls": leaves.get("127.0.0.1")}


@pytest.fixture(scope="module")
def plain() -> Iterator[VerifyingOrigin]:
    with VerifyingOrigin(handler=echo) as server:
        server.trust(KEY)
        yield server


@pytest.fixture(scope="module")
def secure(pki: dict[str, Any]) -> Iterator[VerifyingOrigin]:
    with VerifyingOrigin(handler=echo, tls=pki["tls"]) as server:
        server.trust(KEY)
        yield server


@pytest.fixture(scope="module")
def proxy(
    tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Any], secure: VerifyingOrigin
) -> Iterator[ProxyProcess]:
    config = {
        "log": {"format": "json"},
        "signing": {"signature_agent": "https://agent.example"},
        "upstream": {"pin_ca_files": {"127.0.0.1": str(pki["ca_file"])}},
        "intercept": {"allowed_ports": [secure.port]},
    }
    with ProxyProcess(tmp_path_factory.mktemp("proxy"), config, key=KEY) as process:
        yield process


async def talk(url: str, proxy: ProxyProcess, ssl_context: ssl.SSLContext | bool = True) -> list[object]:
    """Open a WebSocket through the proxy, send a text and a binary message, return the answers."""
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(
            url, proxy=proxy.url, ssl=ssl_context, timeout=aiohttp.ClientWSTimeout(ws_close=WAIT_S)
        ) as ws,
    ):
        await ws.send_str("hello")
        first = await asyncio.wait_for(ws.receive(), WAIT_S)
        await ws.send_bytes(b"\x01\x02\x03")
        second = await asyncio.wait_for(ws.receive(), WAIT_S)
        return [first.data, second.data]


def websocket_events(proxy: ProxyProcess) -> list[dict[str, Any]]:
    events = []
    for line in proxy.stderr_lines:
        try:
            doc = json.loads(line[line.index("{") :])
        except ValueError:
            continue
        if doc.get("event") == "websocket":
            events.append(doc)
    return events


def test_websockets_are_refused_no_more_plain_ws_is_signed_and_relayed(
    proxy: ProxyProcess, plain: VerifyingOrigin
) -> None:
    answers = asyncio.run(talk(plain.url("/chat?room=1").replace("http://", "ws://"), proxy))
    assert answers == ["echo:hello", b"\x03\x02\x01"]
    handshake = plain.arrivals[-1]
    assert handshake.method == "GET"
    assert handshake.target_uri == plain.url("/chat?room=1")  # @target-uri is the http URI it was sent to
    assert handshake.verified, handshake.reason
    assert handshake.oracle == "ok"
    assert handshake.header("upgrade") == "websocket"
    assert handshake.header("sec-websocket-key")
    wait_for(lambda: bool(websocket_events(proxy)), "the websocket's access-log line")
    event = websocket_events(proxy)[-1]
    assert event["bytes_up"] > 0
    assert event["bytes_down"] > 0
    with urllib.request.urlopen(f"{proxy.url}/metrics", timeout=WAIT_S) as scrape:
        metrics = scrape.read().decode()
    assert 'signing_proxy_connect_tunnels_total{kind="websocket"}' in metrics
    assert "signing_proxy_connections_open " in metrics


def test_wss_inside_an_intercepted_connect_is_signed_and_relayed(
    proxy: ProxyProcess, secure: VerifyingOrigin
) -> None:
    url = secure.url("/secure").replace("https://", "wss://")
    done = subprocess.run(
        [sys.executable, "-m", "tests.proxy.ws_client", url, proxy.url, str(proxy.tmp / "data" / "ca.pem")],
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
        check=False,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["echo:hello", "030201"]
    handshake = secure.arrivals[-1]
    assert handshake.target_uri == secure.url("/secure")
    assert handshake.verified, handshake.reason
    assert handshake.oracle == "ok"


def test_a_refused_handshake_is_relayed_with_its_status(proxy: ProxyProcess, plain: VerifyingOrigin) -> None:
    async def attempt() -> int:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await session.ws_connect(plain.url("/refuse").replace("http://", "ws://"), proxy=proxy.url)
            return info.value.status

    assert asyncio.run(attempt()) == 403
    assert plain.arrivals[-1].verified


def handshake_through(proxy: ProxyProcess, answer: bytes) -> tuple[bytes, list[tuple[bytes, ...]], bytes]:
    """A WebSocket handshake through the proxy to a raw upstream that answers ``answer`` and closes:
    the status line and fields the client got, and the handshake the upstream received."""
    got, seen = websocket_handshake(proxy.port, answer, to_eof=False)
    lines = got.partition(b"\r\n\r\n")[0].split(b"\r\n")
    return lines[0], [tuple(part.strip() for part in line.split(b":", 1)) for line in lines[1:]], seen


# the upstream's own hop-by-hop fields: named by its Connection, and Keep-Alive
HOP_ONLY = b"Connection: Upgrade, X-Hop-Only\r\nX-Hop-Only: secret\r\nKeep-Alive: timeout=5\r\n"


def test_a_101_keeps_only_this_hops_connection_and_drops_the_fields_it_names(proxy: ProxyProcess) -> None:
    """RFC 9110 section 7.6.1: what the upstream's ``Connection`` names is for its hop only; the
    client gets ``Connection: Upgrade`` from us, the ``Upgrade`` field and the end-to-end fields."""
    status, fields, sent = handshake_through(
        proxy,
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
        + HOP_ONLY
        + b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nX-End-To-End: kept\r\n\r\n",
    )
    assert status.startswith(b"HTTP/1.1 101 ")
    assert [v for n, v in fields if n.lower() == b"connection"] == [b"Upgrade"]
    assert (b"Upgrade", b"websocket") in fields
    assert (b"X-End-To-End", b"kept") in fields
    assert (b"Sec-WebSocket-Accept", b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=") in fields
    names = {n.lower() for n, _v in fields}
    assert b"x-hop-only" not in names
    assert b"keep-alive" not in names
    assert b"signature" in sent.lower()  # the handshake went out signed


def test_a_refused_handshake_drops_the_upstreams_hop_by_hop_fields_too(proxy: ProxyProcess) -> None:
    status, fields, _ = handshake_through(
        proxy,
        b"HTTP/1.1 403 Forbidden\r\nUpgrade: websocket\r\n"
        + HOP_ONLY
        + b"X-End-To-End: kept\r\nContent-Length: 2\r\n\r\nno",
    )
    assert status.startswith(b"HTTP/1.1 403 ")
    assert [v for n, v in fields if n.lower() == b"connection"] == [b"close"]  # ours: the connection ends
    assert (b"X-End-To-End", b"kept") in fields
    names = {n.lower() for n, _v in fields}
    assert not names & {b"x-hop-only", b"keep-alive", b"upgrade"}


def test_other_upgrades_stay_refused_with_a_reason(proxy: ProxyProcess, plain: VerifyingOrigin) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
        sock.sendall(
            f"GET {plain.url('/h2c')} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n".encode()
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert json.loads(body)["reason"] == "upgrade-not-supported"


def test_a_silent_websocket_closes_after_the_idle_timeout(tmp_path: Path, plain: VerifyingOrigin) -> None:
    config = {"log": {"format": "json"}, "timeouts": {"client_idle_s": 1}}

    async def idle(proxy: ProxyProcess) -> aiohttp.WSMsgType:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(
                plain.url("/idle").replace("http://", "ws://"),
                proxy=proxy.url,
                autoping=False,
                heartbeat=None,
            ) as ws,
        ):
            message = await asyncio.wait_for(ws.receive(), WAIT_S)  # nothing is sent: the proxy closes
            return message.type

    with ProxyProcess(tmp_path, config, key=KEY) as proxy:
        assert asyncio.run(idle(proxy)) in (
            aiohttp.WSMsgType.CLOSED,
            aiohttp.WSMsgType.CLOSE,
            aiohttp.WSMsgType.ERROR,
        )
        wait_for(
            lambda: any(e["outcome"] == "websocket-idle" for e in websocket_events(proxy)), "an idle close"
        )
