"""The proxy's own answers to HEAD (its refusals and /healthz, /readyz, /metrics) are heads alone,
their Content-Length kept (RFC 9110 section 9.3.2): a body after one was read by the client as the
next response on the kept-alive connection ("Bad status line")."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.harness import WAIT_S, ProxyProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    with ProxyProcess(tmp_path_factory.mktemp("head")) as running:
        yield running


def exchange(proxy: ProxyProcess, *requests: bytes) -> bytes:
    """``requests`` pipelined on one connection (the last one closing it); everything answered."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
        sock.sendall(b"".join(requests))
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def split_head(answer: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, rest = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    fields = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return status, fields, rest


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/no-such-route", "HTTP/1.1 404 Not Found"),
        ("/healthz", "HTTP/1.1 200 OK"),
        ("/metrics", "HTTP/1.1 200 OK"),
    ],
)
def test_a_head_answered_by_the_proxy_has_no_body(proxy: ProxyProcess, path: str, status: str) -> None:
    answer = exchange(
        proxy,
        f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    first, fields, rest = split_head(answer)
    assert first == status, answer
    assert int(fields["content-length"]) > 0  # the length the body would have, the body not sent
    second, fields, body = split_head(rest)  # the next response follows the head at once
    assert second == "HTTP/1.1 200 OK", answer
    assert body.startswith(b'{"status":"ok",')
    assert len(body) == int(fields["content-length"])


def test_a_get_still_gets_its_body(proxy: ProxyProcess) -> None:
    answer = exchange(proxy, b"GET /no-such-route HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    status, fields, body = split_head(answer)
    assert status == "HTTP/1.1 404 Not Found"
    assert len(body) == int(fields["content-length"]) > 0
    assert b'"reason":"no-route"' in body


@pytest.mark.parametrize(
    ("path", "status"), [("/healthz", b"HTTP/1.1 200 "), ("/no-such-route", b"HTTP/1.1 404 ")]
)
def test_a_client_that_half_closes_after_its_request_gets_the_answer(
    proxy: ProxyProcess, path: str, status: bytes
) -> None:
    """An answer the proxy writes at once (its own paths, a refusal) was lost when the client's EOF
    came with the request (``printf ... | nc``): the close dropped it (RFC 9112 section 9.6)."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(status), answer
    _, fields, body = split_head(answer)
    assert len(body) == int(fields["content-length"]) > 0
