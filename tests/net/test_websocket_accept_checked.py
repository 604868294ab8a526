"""RFC 6455 section 4.1: a ``101`` without the one ``Sec-WebSocket-Accept`` the handshake's key asks
for fails the handshake: ``502 upstream-bad-response``, the upstream connection closed, nothing piped.

A review found such a ``101`` joined to the client (at a gateway and at an agent, plain and inside an
intercepted CONNECT): a server that never switched then read the client's next bytes, a request no
one signed or checked, as its next request. Here the client sends such a request right behind its
handshake, and the upstream records every byte it gets after its answer. The same upstream also
shows that an HTTP/1.0 ``Upgrade`` and an ``Upgrade`` split over two lines never reach it as a
handshake (RFC 9110 sections 7.8 and 5.3).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from signing_proxy.core.jwk import SigningKey
from tests.harness import WAIT_S, ProxyProcess, wait_for
from tests.oracle import oracle_agent_sign
from tests.proxy.raw_upstream import raw_backend
from tests.proxy.test_gateway_spelling import gateway_before
from tests.verify.directory_host import served_directory

pytestmark = pytest.mark.integration

WS_KEY = "dGhlIHNhbXBsZSBub25jZQ=="
OTHER_KEY = "AQIDBAUGBwgJCgsMDQ4PEA=="
SMUGGLED = b"GET /admin HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"  # what the client sends after its handshake
INTERCEPTED_PORT = 4443  # the CONNECT target: intercepted, and sent on to the next hop


def accept(key: str) -> str:
    """RFC 6455 section 4.2.2, computed here apart from the code under test."""
    digest = hashlib.sha1(key.encode() + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11", usedforsecurity=False)
    return base64.b64encode(digest.digest()).decode()


ACCEPT_LINES = {
    "missing": "",
    "wrong": "Sec-WebSocket-Accept: AAAAAAAAAAAAAAAAAAAAAAAAAAA=\r\n",
    "other-key": f"Sec-WebSocket-Accept: {accept(OTHER_KEY)}\r\n",
    "repeated": f"Sec-WebSocket-Accept: {accept(WS_KEY)}\r\n" * 2,
    "empty": "Sec-WebSocket-Accept:\r\n",
    "good": f"Sec-WebSocket-Accept: {accept(WS_KEY)}\r\n",
}
BAD = [case for case in ACCEPT_LINES if case != "good"]


@dataclass
class Seen:
    """One connection the upstream accepted: the head it read, and every byte after its answer."""

    head: bytes = b""
    after: bytearray = field(default_factory=bytearray)
    ended: threading.Event = field(default_factory=threading.Event)


class Upstream:
    """Answers a handshake to ``/<case>/...`` with a 101 carrying ``ACCEPT_LINES[case]`` (anything
    without ``Upgrade`` with a 200), then records what arrives until the proxy closes."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self._lock = threading.Lock()

    def serve(self, conn: socket.socket) -> None:
        seen = Seen()
        with self._lock:
            self.seen.append(seen)
        with conn, contextlib.suppress(OSError):
            conn.settimeout(WAIT_S)
            data = b""
            while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                data += chunk
            seen.head, _, rest = data.partition(b"\r\n\r\n")
            seen.after += rest
            conn.sendall(self.answer(seen.head))
            while chunk := conn.recv(65536):
                seen.after += chunk
        seen.ended.set()

    @staticmethod
    def answer(head: bytes) -> bytes:
        lines = head.decode("latin-1").split("\r\n")
        if not any(line.lower().startswith("upgrade:") for line in lines[1:]):
            return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
        case = lines[0].split(" ")[1].rsplit("/", 2)[-2]
        return (
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"{ACCEPT_LINES[case]}\r\n"
        ).encode()

    def connection_for(self, path: str) -> Seen:
        """The connection whose request line names ``path`` (waited for)."""
        wanted = f"{path} HTTP/".encode()  # origin-form, or absolute-form to a next hop

        def found() -> Seen | None:
            with self._lock:
                return next((s for s in self.seen if wanted in s.head.split(b"\r\n")[0]), None)

        wait_for(lambda: found() is not None, f"the upstream to read {path}")
        seen = found()
        assert seen is not None
        return seen

    def heads_naming(self, text: str) -> list[bytes]:
        with self._lock:
            return [s.head for s in self.seen if text.encode() in s.head]


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[Upstream, int]]:
    backend = Upstream()
    with raw_backend(backend.serve) as port:
        yield backend, port


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, upstream: tuple[Upstream, int]) -> Iterator[ProxyProcess]:
    """An agent whose every request goes to the raw upstream as its next hop, intercepting CONNECT."""
    config = {
        "log": {"format": "json"},
        "upstream": {"next_hop": f"http://127.0.0.1:{upstream[1]}"},
        "intercept": {"allowed_ports": [INTERCEPTED_PORT]},
    }
    with ProxyProcess(tmp_path_factory.mktemp("agent"), config) as process:
        yield process


def handshake(target: str, host: str, *, version: str = "1.1", extra: str = "") -> bytes:
    return (
        f"GET {target} HTTP/{version}\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        f"{extra}Sec-WebSocket-Key: {WS_KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


def read_head(sock: socket.socket) -> bytes:
    got = b""
    while b"\r\n\r\n" not in got and (chunk := sock.recv(65536)):
        got += chunk
    return got


def read_to_end(sock: socket.socket, got: bytes = b"") -> bytes:
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            got += chunk
    return got


def reason(answer: bytes) -> str:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), answer
    return f"{int(head.split(b' ')[1])} {json.loads(body)['reason']}"


def judged(sock: socket.socket, head: bytes, seen: Seen, *, piped: bool) -> None:
    """``assert_piped`` when the upstream's answer is the one its key asks for, else refused."""
    if piped:
        assert_piped(sock, head, seen)
    else:
        assert_refused_and_nothing_piped(sock, head, seen)


def assert_refused_and_nothing_piped(sock: socket.socket, head: bytes, seen: Seen) -> None:
    assert head.startswith(b"HTTP/1.1 502 "), head  # not the upstream's 101
    assert reason(read_to_end(sock, head)) == "502 upstream-bad-response"
    assert seen.ended.wait(WAIT_S), "the proxy kept the upstream connection of a failed handshake open"
    assert bytes(seen.after) == b"", "what the client sent after its handshake reached the upstream"


def assert_piped(sock: socket.socket, head: bytes, seen: Seen) -> None:
    """The control: a correct 101 reaches the client, and what it sends next reaches the upstream."""
    assert head.startswith(b"HTTP/1.1 101 "), head
    assert f"Sec-WebSocket-Accept: {accept(WS_KEY)}\r\n".encode() in head
    wait_for(lambda: SMUGGLED in seen.after, "the client's bytes to be piped")
    sock.close()
    assert seen.ended.wait(WAIT_S)


@pytest.mark.parametrize("case", [*BAD, "good"])
def test_an_agents_plain_handshake_is_piped_only_on_the_accept_its_key_asks_for(
    agent: ProxyProcess, upstream: tuple[Upstream, int], case: str
) -> None:
    backend, port = upstream
    path = f"/{case}/plain"
    with socket.create_connection(("127.0.0.1", agent.port), timeout=WAIT_S) as sock:
        sock.sendall(handshake(f"ws://127.0.0.1:{port}{path}", f"127.0.0.1:{port}") + SMUGGLED)
        head = read_head(sock)
        seen = backend.connection_for(path)
        judged(sock, head, seen, piped=case == "good")


@pytest.mark.parametrize("case", ["wrong", "missing", "good"])
def test_an_agents_handshake_inside_an_intercepted_connect_is_checked_the_same(
    agent: ProxyProcess, upstream: tuple[Upstream, int], case: str
) -> None:
    backend, _ = upstream
    path = f"/{case}/intercepted"
    context = ssl.create_default_context(cafile=str(agent.tmp / "data" / "ca.pem"))
    with socket.create_connection(("127.0.0.1", agent.port), timeout=WAIT_S) as raw:
        authority = f"127.0.0.1:{INTERCEPTED_PORT}"
        raw.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        assert read_head(raw).startswith(b"HTTP/1.1 200 ")
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(handshake(path, authority) + SMUGGLED)
            head = read_head(tls)
            seen = backend.connection_for(path)
            judged(tls, head, seen, piped=case == "good")


@pytest.mark.parametrize("case", ["wrong", "other-key", "good"])
def test_a_gateways_handshake_is_piped_only_on_the_accept_its_key_asks_for(
    tmp_path: Path, upstream: tuple[Upstream, int], case: str
) -> None:
    backend, port = upstream
    signer = SigningKey.generate()
    with (
        served_directory(signer) as directory,
        ProxyProcess(tmp_path, gateway_before(port, access_log=True)) as gateway,
    ):
        host = f"127.0.0.1:{gateway.port}"
        path = f"/{case}/gateway"
        fields = [
            ("Host", host),
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Key", WS_KEY),
            ("Sec-WebSocket-Version", "13"),
        ]
        signed = oracle_agent_sign(
            "GET", f"http://{host}{path}", b"", signer, signature_agent=directory, head=fields
        )
        request = f"GET {path} HTTP/1.1\r\n" + "".join(f"{n}: {v}\r\n" for n, v in signed) + "\r\n"
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=WAIT_S) as sock:
            sock.sendall(request.encode("latin-1") + SMUGGLED)
            head = read_head(sock)
            seen = backend.connection_for(path)
            judged(sock, head, seen, piped=case == "good")


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("no-key", None),
        ("two-keys", f"Sec-WebSocket-Key: {OTHER_KEY}\r\n"),
        ("key-named-hop-by-hop", "Connection: Sec-WebSocket-Key\r\n"),  # dropped on its way: net.websocket
    ],
    ids=["no-key", "two-keys", "key-named-hop-by-hop"],
)
def test_a_handshake_without_exactly_one_key_to_check_is_refused_before_the_upstream(
    agent: ProxyProcess, upstream: tuple[Upstream, int], name: str, extra: str | None
) -> None:
    backend, port = upstream
    path = f"/good/{name}"
    request = handshake(f"ws://127.0.0.1:{port}{path}", f"127.0.0.1:{port}", extra=extra or "")
    if extra is None:
        request = request.replace(f"Sec-WebSocket-Key: {WS_KEY}\r\n".encode(), b"")
    with socket.create_connection(("127.0.0.1", agent.port), timeout=WAIT_S) as sock:
        sock.sendall(request)
        head = read_head(sock)
        assert head.startswith(b"HTTP/1.1 400 "), head
        assert reason(read_to_end(sock, head)) == "400 upgrade-not-supported"
    assert backend.heads_naming(path) == []


def test_an_http_1_0_upgrade_never_reaches_the_upstream_as_a_handshake(
    agent: ProxyProcess, upstream: tuple[Upstream, int]
) -> None:
    """RFC 9110 section 7.8: a server MUST ignore ``Upgrade`` in an HTTP/1.0 request: no 101, no pipe,
    and whatever reaches the upstream carries no ``Upgrade``."""
    backend, port = upstream
    path = "/good/http10"
    with socket.create_connection(("127.0.0.1", agent.port), timeout=WAIT_S) as sock:
        sock.sendall(handshake(f"http://127.0.0.1:{port}{path}", f"127.0.0.1:{port}", version="1.0"))
        head = read_head(sock)
        assert head.startswith(b"HTTP/1."), head
        assert not head.startswith((b"HTTP/1.1 101 ", b"HTTP/1.0 101 ")), head
        read_to_end(sock, head)  # the connection ends: no pipe holds it open
    for head in backend.heads_naming(path):
        assert b"\r\nupgrade:" not in head.lower(), head


def test_upgrade_split_over_two_lines_is_refused_as_the_same_field_on_one_line(
    agent: ProxyProcess, upstream: tuple[Upstream, int]
) -> None:
    """RFC 9110 section 5.3: ``Upgrade: websocket`` and ``Upgrade: h2c`` are ``websocket, h2c``."""
    backend, port = upstream
    answers = []
    for name, extra in (("split", "Upgrade: h2c\r\n"), ("one-line", "")):
        path = f"/good/{name}"
        request = handshake(f"ws://127.0.0.1:{port}{path}", f"127.0.0.1:{port}", extra=extra)
        if not extra:
            request = request.replace(b"Upgrade: websocket\r\n", b"Upgrade: websocket, h2c\r\n")
        with socket.create_connection(("127.0.0.1", agent.port), timeout=WAIT_S) as sock:
            sock.sendall(request)
            head = read_head(sock)
            assert head.startswith(b"HTTP/1.1 400 "), (name, head)
            answers.append(reason(read_to_end(sock, head)))
        assert backend.heads_naming(path) == []
    assert answers == ["400 upgrade-not-supported"] * 2
