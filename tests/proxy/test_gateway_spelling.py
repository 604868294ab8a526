"""The gateway mode checks, and sends on, the request target as it arrived.

RFC 9421 section 2.2.2: ``@target-uri`` is assembled from the authority and the request target as
received. The gateway took the Host as received but its routes rebuilt the request target in our
normal form (an empty query dropped), so a third party that signed ``/feed?`` (pyauth does) was
refused ``bad-signature``, and the backend got ``/feed``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.proxy.exchange import Routes
from signing_proxy.proxy.gateway import GatewayPipeline
from tests.harness import WAIT_S, ProxyProcess
from tests.oracle import oracle_agent_sign
from tests.proxy.raw_upstream import raw_backend, request_line
from tests.verify.directory_host import served_directory


async def test_the_gateways_routes_keep_the_request_target_as_received(tmp_path: Path) -> None:
    routes = Routes([("/", "http://127.0.0.1:9000")], as_received=True)
    target = routes.target_for("/v1/x?")
    assert target is not None
    assert (target.path_query, target.wire_parts()) == ("/v1/x", ("127.0.0.1:9000", "/v1/x?"))
    same = routes.target_for("/v1/x?a=1")
    assert same is not None
    assert same.received is None  # nothing to keep: the spelling is the normal one
    agents = Routes([("/", "http://127.0.0.1:9000")]).target_for("/v1/x?")
    assert agents is not None
    assert agents.received is None  # an agent's routes send the normal form
    config = parse_config(
        {
            "mode": "gateway",
            "data_dir": str(tmp_path),
            "gateway": {"upstream": "http://127.0.0.1:9000", "hosts": ["gw.example"]},
        }
    )
    pipeline = GatewayPipeline(config)
    try:
        assert pipeline.signed_uri(target, [("Host", "GW.example")]) == "http://GW.example/v1/x?"
    finally:
        await pipeline.close()


def gateway_before(backend_port: int, *, access_log: bool = False) -> dict[str, Any]:
    """A gateway's configuration in front of the backend on ``backend_port`` (loopback directories
    allowed), its log in JSON."""
    return {
        "mode": "gateway",
        "log": {"format": "json", "access_log": access_log},
        "egress": {"allow_private": ["127.0.0.1/32"]},
        "gateway": {"upstream": f"http://127.0.0.1:{backend_port}"},
    }


@contextmanager
def recording_backend() -> Iterator[tuple[int, list[bytes]]]:
    """Answers 200 to every request; records each request line."""
    seen: list[bytes] = []

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(WAIT_S)
            line = request_line(conn)
            if line is None:
                return
            seen.append(line)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    with raw_backend(serve) as port:
        yield port, seen


@contextmanager
def gateway_for(agent: SigningKey, tmp_path: Path) -> Iterator[tuple[ProxyProcess, str, int, list[bytes]]]:
    """A gateway (``gateway_before``) in front of a ``recording_backend``, ``agent``'s directory
    served: (the gateway, the directory's base URL, the backend's port, the request lines it got)."""
    with (
        recording_backend() as (backend_port, seen),
        served_directory(agent) as base,
        ProxyProcess(tmp_path, gateway_before(backend_port)) as gateway,
    ):
        yield gateway, base, backend_port, seen


def get(port: int, request_target: str, host: str, lines: list[tuple[str, str]]) -> bytes:
    """One GET on its own connection (no client library respells the target); the whole answer."""
    head = f"GET {request_target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
    head += "".join(f"{n}: {v}\r\n" for n, v in lines) + "\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(head.encode("latin-1"))
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


@pytest.mark.integration
@pytest.mark.parametrize("request_target", ["/feed?", "/feed?page=2"], ids=["empty-query", "query"])
def test_a_third_partys_signature_over_the_target_it_sent_passes_and_the_backend_gets_it(
    tmp_path: Path, request_target: str
) -> None:
    agent = SigningKey.generate()
    with gateway_for(agent, tmp_path) as (gateway, base, _, seen):
        host = f"127.0.0.1:{gateway.port}"
        signed = oracle_agent_sign("GET", f"http://{host}{request_target}", b"", agent, signature_agent=base)
        answer = get(gateway.port, request_target, host, signed)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert seen == [f"GET {request_target} HTTP/1.1".encode()]


@pytest.mark.integration
def test_an_absolute_form_target_is_refused_not_checked_against_the_host(tmp_path: Path) -> None:
    """RFC 9112 section 3.3: an absolute-form request target is the target URI (Host is ignored), and
    RFC 9421 signs that. The gateway checked the signature over ``http://`` + Host + path instead:
    a request naming the backend's own address passed, signed over a URI it did not target. It is
    refused as the middleware and ``verify-origin`` refuse a target not in origin form."""
    agent = SigningKey.generate()
    with gateway_for(agent, tmp_path) as (gateway, base, backend_port, seen):
        host = f"127.0.0.1:{gateway.port}"
        by_host = oracle_agent_sign("GET", f"http://{host}/feed", b"", agent, signature_agent=base)
        absolute = f"http://127.0.0.1:{backend_port}/feed"
        as_targeted = oracle_agent_sign("GET", absolute, b"", agent, signature_agent=base)
        answers = [get(gateway.port, absolute, host, signed) for signed in (by_host, as_targeted)]
        control = get(gateway.port, "/feed", host, by_host)
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert b"malformed-target" in answer
    assert control.startswith(b"HTTP/1.1 200"), control  # the same signature, origin-form: passes
    assert seen == [b"GET /feed HTTP/1.1"]
