"""``net.client.HttpClient``, the package's one HTTP client, against scripted loopback servers.

Each server binds 127.0.0.1 port 0, records the raw request bytes and answers from a script, so a
test asserts exactly what went on the wire: origin form or absolute form (``via``), the bytes a
``prepare`` callable produced, bounds on size and time, the one retry on a reused connection, and
TLS verified against ``upstream.ca_file`` or a pinned CA.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from signing_proxy.config import TimeoutsConfig, UpstreamConfig
from signing_proxy.core.fields import Fields
from signing_proxy.core.uri import Target, parse_absolute_uri
from signing_proxy.errors import ProxyError
from signing_proxy.net.client import HttpClient
from signing_proxy.net.framing import Outgoing, outgoing
from signing_proxy.net.leaves import LeafContextCache
from signing_proxy.storage.ca import CertificateAuthority

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\nX-A: 2\r\n\r\nok"


@dataclass
class Scripted:
    """A loopback server: records each request head; answers the n-th with ``answers[n]`` (or OK)."""

    answers: list[bytes | None] = field(default_factory=list)  # None: close without answering
    heads: list[bytes] = field(default_factory=list)
    connections: int = 0
    port: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                answer = self.answers[len(self.heads) - 1] if len(self.heads) <= len(self.answers) else OK
                if answer is None:
                    break
                if answer == b"hang":
                    await self.release.wait()
                    break
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
async def scripted() -> AsyncIterator[Scripted]:
    server = Scripted()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        server.release.set()
        listener.close()
        await listener.wait_closed()


@pytest.fixture
async def client() -> AsyncIterator[HttpClient]:
    async with HttpClient.standalone() as c:
        yield c


async def test_an_unsigned_get_goes_in_origin_form_and_the_answer_is_buffered(
    scripted: Scripted, client: HttpClient
) -> None:
    answer = await client.fetch(
        "GET",
        f"{scripted.url}/a?b=1",
        headers=[("Accept", "*/*"), ("Connection", "x"), ("X", "y")],
        max_bytes=10,
    )
    assert (answer.status, answer.reason, answer.body, answer.truncated) == (200, "OK", b"ok", False)
    assert answer.header("x-a") == "1, 2"
    assert answer.header("missing") is None
    head = scripted.heads[0].decode()
    assert head.startswith(f"GET /a?b=1 HTTP/1.1\r\nHost: 127.0.0.1:{scripted.port}\r\nAccept: */*\r\n")
    assert "Content-Length" not in head
    assert "Connection" not in head  # hop-by-hop: dropped
    assert "\r\nX: y\r\n" not in head  # and so is what Connection names


async def test_a_post_carries_its_body_and_the_connection_is_reused(
    scripted: Scripted, client: HttpClient
) -> None:
    for _ in range(2):
        answer = await client.fetch("POST", f"{scripted.url}/p", body=b'{"a":1}', max_bytes=10)
        assert answer.status == 200
    assert "Content-Length: 7\r\n" in scripted.heads[0].decode()
    assert scripted.connections == 1


async def test_via_sends_absolute_form_to_the_relay(scripted: Scripted) -> None:
    relay = parse_absolute_uri(scripted.url + "/")
    async with HttpClient.standalone(via=relay) as client:
        answer = await client.fetch("GET", "http://origin.example/x", max_bytes=10)
    assert answer.status == 200
    assert scripted.heads[0].startswith(b"GET http://origin.example/x HTTP/1.1\r\nHost: origin.example\r\n")


async def test_prepare_decides_the_bytes_and_is_called_again_for_the_retry(
    scripted: Scripted, client: HttpClient
) -> None:
    calls: list[str] = []

    async def prepare(
        method: str, target: Target, lines: Sequence[tuple[str, str]], body: bytes, /, *, framed: bool
    ) -> Outgoing:
        calls.append(method)
        fields = Fields([*lines, ("Signature", f"sig{len(calls)}")])
        return outgoing(method, target, fields, body, framed=framed, keyid="k", via=None)

    await client.fetch("GET", f"{scripted.url}/1", max_bytes=10, prepare=prepare)
    scripted.answers = [OK, None]  # the pooled connection is closed by the server on the next request
    await client.fetch("GET", f"{scripted.url}/2", max_bytes=10, prepare=prepare)
    assert calls == ["GET", "GET", "GET"]  # the second fetch was prepared twice: a fresh signature
    assert [b"Signature: sig" in h for h in scripted.heads] == [True, True, True]
    assert b"sig3" in scripted.heads[2]
    assert scripted.connections == 2


async def test_a_reset_of_a_fresh_connection_is_not_retried(scripted: Scripted, client: HttpClient) -> None:
    scripted.answers = [None]
    with pytest.raises(ProxyError) as err:
        await client.fetch("GET", f"{scripted.url}/x", max_bytes=10)
    assert (err.value.status, err.value.reason) == (502, "upstream-reset")
    assert len(scripted.heads) == 1


async def test_size_bound_refuses_or_truncates(scripted: Scripted, client: HttpClient) -> None:
    big = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100
    scripted.answers = [big, big]
    with pytest.raises(ProxyError) as err:
        await client.fetch("GET", f"{scripted.url}/x", max_bytes=10)
    assert (err.value.status, err.value.reason) == (502, "response-too-large")
    answer = await client.fetch("GET", f"{scripted.url}/x", max_bytes=10, truncate=True)
    assert (answer.body, answer.truncated) == (b"x" * 10, True)


async def test_total_s_bounds_the_whole_exchange(scripted: Scripted, client: HttpClient) -> None:
    scripted.answers = [b"hang"]
    with pytest.raises(ProxyError) as err:
        await client.fetch("GET", f"{scripted.url}/x", max_bytes=10, total_s=0.2)
    assert (err.value.status, err.value.reason) == (504, "upstream-timeout")


async def test_a_url_that_is_not_absolute_http_is_a_400(client: HttpClient) -> None:
    with pytest.raises(ProxyError) as err:
        await client.fetch("GET", "/relative", max_bytes=10)
    assert err.value.status == 400


async def test_close_empties_an_owned_pool_only(scripted: Scripted) -> None:
    owned = HttpClient.standalone()
    await owned.fetch("GET", f"{scripted.url}/x", max_bytes=10)
    target = parse_absolute_uri(scripted.url + "/")
    shared = HttpClient(owned.pool, TimeoutsConfig())
    await shared.close()
    conn = owned.pool.take_idle(target)
    assert conn is not None  # a client on someone else's pool leaves it alone
    owned.pool.release(conn)
    await owned.close()
    assert owned.pool.take_idle(target) is None


# --- TLS: upstream.ca_file and upstream.pin_ca_files apply -----------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ssl.SSLContext]]:
    tmp = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority.generate()
    (tmp / "ca.pem").write_bytes(ca.cert_pem())
    with LeafContextCache(ca, 4) as leaves:
        yield tmp / "ca.pem", leaves.get("127.0.0.1")


@pytest.fixture
async def tls_server(pki: tuple[Path, ssl.SSLContext]) -> AsyncIterator[Scripted]:
    server = Scripted()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=pki[1])
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listener.close()
        await listener.wait_closed()


@pytest.mark.parametrize("trust", ["none", "ca_file", "pin"])
async def test_https_is_verified_against_the_configured_cas(
    tls_server: Scripted, pki: tuple[Path, ssl.SSLContext], trust: str
) -> None:
    ca_file = str(pki[0])
    upstream = {
        "none": UpstreamConfig(),
        "ca_file": UpstreamConfig(ca_file=ca_file),
        "pin": UpstreamConfig(pin_ca_files={"127.0.0.1": ca_file}),
    }[trust]
    url = f"https://127.0.0.1:{tls_server.port}/x"
    async with HttpClient.standalone(upstream, TimeoutsConfig(connect_s=5, read_s=5)) as client:
        if trust == "none":
            with pytest.raises(ProxyError) as err:
                await client.fetch("GET", url, max_bytes=10)
            assert err.value.reason == "upstream-certificate-invalid"
        else:
            assert (await client.fetch("GET", url, max_bytes=10)).status == 200
