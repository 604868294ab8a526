"""Issue 16, item 7 ("Smaller holes") as the proxy port sees them: blind tunnels close after
``timeouts.client_idle_s`` of silence both ways, CONNECT userinfo never reaches a log line, and a
``Content-Digest`` naming ``sha-256`` twice is refused by a relay (``401``).

Everything runs against ``signing-proxy run`` as a real process on 127.0.0.1 port 0.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.signatures import Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, wait_for

pytestmark = pytest.mark.integration

AGENT = SigningKey.generate()
RELAY = SigningKey.generate()
IDLE_S = 2.5  # timeouts.client_idle_s of the tunnel test
STEP_S = 0.2  # traffic every STEP_S keeps a tunnel alive well past IDLE_S (IDLE_S - STEP_S of slack)
STEPS = 16  # each one-way phase (STEPS - 1) * STEP_S = 3.0 s, over IDLE_S: a one-way-blind timer fires


class TickServer:
    """A TCP server on 127.0.0.1 port 0: per connection, ``STEPS`` ticks one ``STEP_S`` apart, then it
    reads ``STEPS`` pings and answers ``done``, then stays silent until the peer closes."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.peer_closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> TickServer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.sock.close()
        self._thread.join(WAIT_S)

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.sock.accept()
            with conn:
                conn.settimeout(WAIT_S * 2)
                for _ in range(STEPS):
                    conn.sendall(b"t")
                    time.sleep(STEP_S)  # paced traffic in one direction only (server -> client)
                pings = b""
                while len(pings) < STEPS:
                    chunk = conn.recv(64)
                    if not chunk:
                        return
                    pings += chunk
                conn.sendall(b"done")
                while conn.recv(64):  # silence from here on, until the tunnel closes us
                    pass
                self.peer_closed.set()


def connect(proxy: ProxyProcess, authority: str) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S)
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        if not chunk:
            break
        head += chunk
    return sock, head


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def events(proxy: ProxyProcess, event: str) -> list[dict[str, Any]]:
    out = []
    for line in proxy.stderr_lines:
        with contextlib.suppress(ValueError):
            doc = json.loads(line[line.find("{") :]) if "{" in line else None
            if isinstance(doc, dict) and doc.get("event") == event:
                out.append(doc)
    return out


@pytest.fixture
def tick_server() -> Iterator[TickServer]:
    with TickServer() as server:
        yield server


def test_smaller_holes_blind_tunnel_closes_after_client_idle_s_of_silence(
    tmp_path: Path, tick_server: TickServer
) -> None:
    config = {
        "log": {"format": "json"},
        "timeouts": {"client_idle_s": IDLE_S},
        "intercept": {"tunnel": ["127.0.0.1"], "allowed_ports": [tick_server.port]},
    }
    authority = f"127.0.0.1:{tick_server.port}"
    with ProxyProcess(tmp_path, config, key=AGENT) as proxy:
        sock, head = connect(proxy, authority)
        with sock:
            assert head.startswith(b"HTTP/1.1 200"), head
            # traffic one way only (upstream -> client) for longer than IDLE_S: the tunnel stays
            assert recv_exactly(sock, STEPS) == b"t" * STEPS
            # then the other way only (client -> upstream), again for longer than IDLE_S
            for _ in range(STEPS):
                sock.sendall(b"p")
                time.sleep(STEP_S)
            assert recv_exactly(sock, 4) == b"done"
            # then silence both ways: the proxy closes both sides
            assert sock.recv(64) == b""
        assert tick_server.peer_closed.wait(WAIT_S)
        wait_for(lambda: any(e.get("host") == authority for e in events(proxy, "tunnel")), "the tunnel line")
    [line] = [e for e in events(proxy, "tunnel") if e.get("host") == authority]
    assert line["ended"] == "idle"
    assert line["outcome"] == "tunnelled"
    assert line["bytes_up"] == STEPS
    assert line["bytes_down"] == STEPS + 4


def test_smaller_holes_connect_userinfo_is_never_logged(tmp_path: Path, tick_server: TickServer) -> None:
    secret = "s3cret-pass"
    config = {
        "log": {"format": "json", "level": "debug"},
        "intercept": {"tunnel": ["127.0.0.1"], "allowed_ports": [tick_server.port]},
    }
    with VerifyingOrigin() as origin, ProxyProcess(tmp_path, config, key=AGENT) as proxy:
        origin.trust(AGENT)
        # authority-form is host and port (RFC 9110 section 9.3.6): userinfo is refused, unlogged
        for port in (tick_server.port, 1):
            refused, head = connect(proxy, f"agent:{secret}@127.0.0.1:{port}")
            with refused:
                assert head.startswith(b"HTTP/1.1 400"), head
                assert b"malformed-target" in head + refused.recv(4096)
        tunnelled, head = connect(proxy, f"127.0.0.1:{tick_server.port}")
        with tunnelled:
            assert head.startswith(b"HTTP/1.1 200"), head
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as plain:
            url = f"http://agent:{secret}@127.0.0.1:{origin.port}/userinfo"
            plain.sendall(f"GET {url} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            assert recv_exactly(plain, 12).startswith(b"HTTP/1.1 200")
        wait_for(
            lambda: len([d for d in proxy.access_lines() if d["method"] == "CONNECT"]) == 3,
            "three CONNECT lines",
        )
        wait_for(lambda: any(d["method"] == "GET" for d in proxy.access_lines()), "the GET line")
        wait_for(lambda: bool(events(proxy, "tunnel")), "the tunnel line")
    connects = [d for d in proxy.access_lines() if d["method"] == "CONNECT"]
    tick = f"127.0.0.1:{tick_server.port}"
    assert sorted(d["host"] for d in connects) == sorted([tick, tick, "127.0.0.1:1"])
    [get] = [d for d in proxy.access_lines() if d["method"] == "GET"]
    assert get["host"] == "127.0.0.1"
    assert events(proxy, "tunnel")[0]["host"] == f"127.0.0.1:{tick_server.port}"
    assert not [line for line in proxy.stderr_lines if secret in line or "agent:" in line]
    [arrival] = origin.arrivals
    assert arrival.target_uri == f"http://127.0.0.1:{origin.port}/userinfo"  # userinfo never sent either


def signed_for_relay(url: str, digest: str, body: bytes) -> bytes:
    """A POST signed by AGENT (empty Signature-Agent: a pinned key) with Content-Digest ``digest``."""
    fields = Fields(
        [
            ("Content-Type", "application/json"),
            ("Content-Digest", digest),
            ("Authorization", ""),
            ("Signature-Agent", ""),
        ]
    )
    created = int(time.time())
    message = Message("POST", parse_absolute_uri(url), fields)
    attach_signature(fields, sign_message(message, AGENT, created=created, expires=created + 60))
    head = f"POST {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{n}: {v}\r\n" for n, v in fields) + "\r\n"
    return head.encode() + body


def send(proxy: ProxyProcess, raw: bytes) -> tuple[int, dict[str, Any]]:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
        sock.sendall(raw)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), (json.loads(body) if body.startswith(b"{") else {})


def test_smaller_holes_duplicate_content_digest_members_are_refused_at_the_relay(tmp_path: Path) -> None:
    pinned = tmp_path / "agent.pub.jwk"
    pinned.write_text(json.dumps(AGENT.public.jwk()))
    config = {"mode": "relay", "relay": {"pinned_agent_keys": [str(pinned)]}, "intercept": {"enabled": False}}
    body = b'{"ver":"1.0"}'
    good = content_digest(body)
    with VerifyingOrigin() as origin, ProxyProcess(tmp_path, config, key=RELAY) as relay:
        origin.trust(AGENT, RELAY)
        status, doc = send(relay, signed_for_relay(origin.url("/once"), good, body))
        assert status == 200, doc  # the rig works: one sha-256 member passes
        for digest in (
            f"{good}, {good}",  # the same member twice
            f"{good}, sha-256=:{'A' * 43}=:",  # last wins would hide the first
            f"sha-256=:{'A' * 43}=:, {good}",  # last wins would pick the matching one
            f"{good}, sha-512=:{'A' * 86}==:, {good};x=1",  # with parameters, around another member
        ):
            status, doc = send(relay, signed_for_relay(origin.url("/twice"), digest, body))
            assert (status, doc.get("reason")) == (401, "duplicate-content-digest"), (digest, doc)
    assert [a.target_uri for a in origin.arrivals] == [origin.url("/once")]
