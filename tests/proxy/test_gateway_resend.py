"""A gateway verifies a request once: the engine's resend of an idempotent request (a pooled backend
connection reset before any answer) is the verified request again, never a second check. A second
check would refuse the request's own signature as replayed (401 ``signature-replayed``) and count
its accesses twice."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.signatures import Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.proxy.gateway import GatewayPipeline
from signing_proxy.verify.gateway import GatewayVerdict
from tests.harness import ProxyProcess
from tests.proxy.raw_upstream import raw_backend, request_line
from tests.verify.directory_host import served_directory


def signed_lines(method: str, url: str, key: SigningKey, agent_base: str) -> list[tuple[str, str]]:
    now = int(time.time())
    fields = Fields(
        [("Content-Digest", content_digest(b"")), ("Authorization", ""), ("Signature-Agent", agent_base)]
    )
    message = Message(method, parse_absolute_uri(url), fields)
    attach_signature(fields, sign_message(message, key, created=now, expires=now + 60))
    return list(fields)


def get(port: int, path: str, host: str, lines: list[tuple[str, str]]) -> bytes:
    """One GET on its own connection; the answer's head and body (Content-Length framed)."""
    head = f"GET {path} HTTP/1.1\r\nHost: {host}\r\n" + "".join(f"{n}: {v}\r\n" for n, v in lines)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode("latin-1") + b"\r\n")
        out = b""
        while b"\r\n\r\n" not in out:
            chunk = sock.recv(65536)
            if not chunk:
                return out
            out += chunk
        top, _, rest = out.partition(b"\r\n\r\n")
        length = next(
            (
                int(v)
                for n, _, v in (x.partition(b":") for x in top.split(b"\r\n")[1:])
                if n.lower() == b"content-length"
            ),
            0,
        )
        while len(rest) < length and (chunk := sock.recv(65536)):
            rest += chunk
        return top + b"\r\n\r\n" + rest


@contextmanager
def resetting_backend() -> Iterator[tuple[int, list[bytes]]]:
    """Answers the first request of a connection (keep-alive), then closes it without an answer when
    the next one arrives, as a server whose keep-alive timer just fired does."""
    seen: list[bytes] = []

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            first = request_line(conn)  # GETs without a body, one at a time on a connection
            if first is None:
                return
            seen.append(first)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            second = request_line(conn)
            if second is not None:
                seen.append(second)  # and the connection closes with no answer

    with raw_backend(serve) as port:
        yield port, seen


@pytest.mark.integration
def test_a_resent_request_is_not_refused_as_its_own_replay(tmp_path: Path) -> None:
    agent = SigningKey.generate()
    with resetting_backend() as (backend_port, seen), served_directory(agent) as base:
        config: dict[str, Any] = {
            "mode": "gateway",
            "log": {"format": "json", "access_log": False},
            "egress": {"allow_private": ["127.0.0.1/32"]},
            "gateway": {"upstream": f"http://127.0.0.1:{backend_port}", "replay_protection": True},
        }
        with ProxyProcess(tmp_path, config) as gateway:
            host = f"127.0.0.1:{gateway.port}"
            first = get(gateway.port, "/a", host, signed_lines("GET", f"http://{host}/a", agent, base))
            # the pooled connection is reset at this request: the engine resends it on a new one
            lines = signed_lines("GET", f"http://{host}/b", agent, base)
            second = get(gateway.port, "/b", host, lines)
            assert first.startswith(b"HTTP/1.1 200"), first
            assert second.startswith(b"HTTP/1.1 200"), second
            assert seen == [b"GET /a HTTP/1.1", b"GET /b HTTP/1.1", b"GET /b HTTP/1.1"]
            # the same signature in another request is still a replay
            again = get(gateway.port, "/b", host, lines)
            assert again.startswith(b"HTTP/1.1 401"), again
            assert b"signature-replayed" in again


class CountingVerifier:
    """Stands in for ``GatewayVerifier``: counts its checks, passes what it is told to."""

    def __init__(self, verdict: GatewayVerdict) -> None:
        self.verdict = verdict
        self.checks = 0

    async def check(self, method: str, target_uri: str, fields: Fields, body: bytes) -> GatewayVerdict:
        self.checks += 1
        return self.verdict


async def test_prepare_is_a_check_at_every_call(tmp_path: Path) -> None:
    """The pipeline keeps nothing between requests: the engine, not ``prepare``, sends a verified
    request again. (It used to remember the last request a task verified, and passed a call with the
    same field-lines object unchecked.)"""
    agent = SigningKey.generate()
    config = parse_config(
        {
            "mode": "gateway",
            "data_dir": str(tmp_path),
            "egress": {"allow_private": ["127.0.0.1/32"]},
            "gateway": {"upstream": "http://127.0.0.1:9000", "hosts": ["gw.example"]},
        }
    )
    pipeline = GatewayPipeline(config)
    real = pipeline.verifier
    try:
        # a real verdict, from the gateway's own verifier
        with served_directory(agent) as base:
            lines = [("Host", "gw.example"), *signed_lines("GET", "http://gw.example/x", agent, base)]
            target = parse_absolute_uri("http://127.0.0.1:9000/x")
            verdict = await real.check("GET", "http://gw.example/x", Fields(lines[1:]), b"")
        counting = CountingVerifier(verdict)
        pipeline.verifier = counting  # type: ignore[assignment]
        sent = await pipeline.prepare("GET", target, lines, b"", framed=False)
        again = await pipeline.prepare("GET", target, lines, b"", framed=False)
        assert counting.checks == 2
        assert (again.head, again.body, again.keyid) == (sent.head, sent.body, sent.keyid)
    finally:
        pipeline.verifier = real
        await pipeline.close()
