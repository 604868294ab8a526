"""A relay sends on the target as received wherever the request came from, and every component it
derives from the target agrees with what it sends (RFC 9421 sections 2.2.2 and 2.2.5).

Each test signs as a third party does (pyauth, ``http-message-signatures``: its components are the
URI exactly as given) for a path with an empty query, ``/x?``, which our normal form writes ``/x``.
The origin verifies every label with our verifier and with pyauth.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.harness import WAIT_S
from tests.oracle import oracle_sign
from tests.proxy.test_relay import AGENT, running_relay, signed_post

pytestmark = pytest.mark.integration

BODY = b'{"ver":"1.0"}'  # signed_post's


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
    async with running_relay(tmp_path, lambda origin: {"intercept": {"allowed_ports": [origin.port]}}) as rig:
        origin = rig.origin
        url = origin.url("/x?")
        raw = request("POST", "/x?", f"127.0.0.1:{origin.port}", signed_post(url, rig.agent_dir.base), BODY)
        answer = await exchange(rig.relay_port, raw, tunnel_to=origin.port)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    (arrival,) = origin.arrivals
    assert arrival.target_uri == url
    assert (arrival.verified, arrival.oracle, arrival.labels) == (True, "ok", ["agent", "broker"])


@pytest.mark.parametrize("path", ["/x?", "/x?a=1"], ids=["empty-query", "query"])
async def test_request_target_is_the_one_sent(tmp_path: Path, path: str) -> None:
    """A web-bot-auth label may cover ``@request-target``, and the relay's label covers what the
    agent's does. It was written in the normal form (``/x``) while ``/x?`` went out: the relay refused
    the agent's label, and signed its own over a request target the origin did not receive."""
    async with running_relay(tmp_path, lambda _origin: {"profiles": {"default": "web-bot-auth"}}) as rig:
        origin = rig.origin
        url = origin.url(path)
        signed = oracle_sign(
            "GET",
            url,
            [("Signature-Agent", f'"{rig.agent_dir.base}"')],
            b"",
            keyid=AGENT.thumbprint,
            private_key=AGENT._private,
            now=int(time.time()),
            components=("@authority", "@request-target", "signature-agent"),
            tag="web-bot-auth",
        )
        answer = await exchange(rig.relay_port, request("GET", url, "x", signed, b""))
    assert answer.startswith(b"HTTP/1.1 200"), answer
    (arrival,) = origin.arrivals
    assert arrival.target_uri == url
    assert (arrival.verified, arrival.oracle, arrival.labels) == (True, "ok", ["agent", "broker"])


async def test_a_relays_route_sends_on_the_request_target_as_received(tmp_path: Path) -> None:
    """A relay's sidecar route (``/up/`` to the origin) keeps the rest of the request target as it
    came, ``x?`` included, as its absolute-form and tunnelled requests do."""
    async with running_relay(
        tmp_path, lambda origin: {"routes": [{"prefix": "/up/", "upstream": origin.url("/")}]}
    ) as rig:
        origin = rig.origin
        url = origin.url("/x?")  # where the route sends it: what the agent signs
        raw = request(
            "POST", "/up/x?", f"127.0.0.1:{rig.relay_port}", signed_post(url, rig.agent_dir.base), BODY
        )
        answer = await exchange(rig.relay_port, raw)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    (arrival,) = origin.arrivals
    assert arrival.target_uri == url
    assert (arrival.verified, arrival.oracle, arrival.labels) == (True, "ok", ["agent", "broker"])
