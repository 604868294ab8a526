"""``net.client.HttpClient``, the package's one HTTP client, against scripted loopback servers.

Each server binds 127.0.0.1 port 0, records the raw request bytes and answers from a script, so a
test asserts exactly what went on the wire: origin form or absolute form (``via``), the bytes a
``prepare`` callable produced, bounds on size and time, the one retry on a reused connection, and
TLS verified against ``upstream.ca_file`` or a pinned CA.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from signing_proxy.config import TimeoutsConfig, UpstreamConfig
from signing_proxy.core.fields import Fields
from signing_proxy.core.uri import Target, parse_absolute_uri
from signing_proxy.errors import EgressError, ProxyError
from signing_proxy.net.client import HttpClient
from signing_proxy.net.egress import EgressPolicy
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


# --- egress: a URL named by a remote party (net.egress) ---------------------------------------------


LOOPBACK_OK = EgressPolicy(["127.0.0.1/32"])


def resolve_as(monkeypatch: pytest.MonkeyPatch, *answers: list[str]) -> list[str]:
    """Make this loop's ``getaddrinfo`` answer ``answers[n]`` to the n-th call; returns the hosts asked."""
    calls: list[str] = []

    async def fake(host: str, port: int, **_kw: object) -> list[tuple[object, ...]]:
        calls.append(host)
        answer = answers[min(len(calls), len(answers)) - 1]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in answer]

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", fake)
    return calls


async def test_a_refused_fetch_sends_no_packet(
    scripted: Scripted, client: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    resolve_as(monkeypatch, ["127.0.0.1"])
    port = scripted.port
    shapes = {
        f"https://127.0.0.1:{port}/": "egress-address",
        f"http://127.0.0.1:{port}/": "egress-address",
        f"https://[::ffff:127.0.0.1]:{port}/": "egress-address",
        f"https://internal.test:{port}/": "egress-address",  # a name resolving to loopback
        f"http://internal.test:{port}/": "egress-scheme",
        f"https://u:p@127.0.0.1:{port}/": "egress-userinfo",
        f"https://127.0.0.1:{port}/latest/meta-data/iam/security-credentials/role#": "egress-fragment",
    }
    for url, reason in shapes.items():
        with pytest.raises(EgressError) as err:
            await client.fetch("GET", url, max_bytes=10, egress=EgressPolicy())
        assert err.value.reason == reason, url
    # accepted connections are served in order: once this one is answered, any earlier one was counted
    assert (await client.fetch("GET", f"{scripted.url}/", max_bytes=10, egress=LOOPBACK_OK)).status == 200
    assert scripted.connections == 1


async def test_allow_private_admits_loopback_over_http_on_a_connection_of_its_own(
    scripted: Scripted, client: HttpClient
) -> None:
    for _ in range(2):
        answer = await client.fetch("GET", f"{scripted.url}/d?x=1", max_bytes=10, egress=LOOPBACK_OK)
        assert (answer.status, answer.body) == (200, b"ok")
    head = scripted.heads[0].decode()
    assert head.startswith(f"GET /d?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{scripted.port}\r\n")
    assert "\r\nConnection: close\r\n" in head
    assert scripted.connections == 2  # egress connections are never pooled
    assert client.pool.take_idle(parse_absolute_uri(scripted.url + "/")) is None


async def test_a_rebinding_name_is_connected_to_the_vetted_address_only(
    scripted: Scripted, client: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # first answer: the allow-listed server; any later lookup would answer another loopback address
    calls = resolve_as(monkeypatch, ["127.0.0.1"], ["127.0.0.2"])
    answer = await client.fetch(
        "GET", f"http://rebind.test:{scripted.port}/x", max_bytes=10, egress=LOOPBACK_OK
    )
    assert answer.status == 200
    assert calls == ["rebind.test"]  # resolved once, by vet; the connect used the vetted address
    assert scripted.heads[0].startswith(f"GET /x HTTP/1.1\r\nHost: rebind.test:{scripted.port}\r\n".encode())


async def test_a_name_resolving_to_a_private_address_is_refused(
    client: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    resolve_as(monkeypatch, ["10.20.30.40"])
    with pytest.raises(EgressError) as err:
        await client.fetch("GET", "https://corp.test/.well-known/x", max_bytes=10, egress=EgressPolicy())
    assert err.value.reason == "egress-address"
    assert "10.20.30.40" not in err.value.detail
    assert client.pool.connections_opened == 0


async def test_a_redirect_is_returned_not_followed(scripted: Scripted, client: HttpClient) -> None:
    scripted.answers = [
        b"HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/latest/\r\nContent-Length: 0\r\n\r\n"
    ]
    answer = await client.fetch("GET", f"{scripted.url}/d", max_bytes=10, egress=LOOPBACK_OK)
    assert (answer.status, answer.header("location")) == (302, "http://169.254.169.254/latest/")
    assert len(scripted.heads) == 1


async def test_an_egress_body_is_bounded(scripted: Scripted, client: HttpClient) -> None:
    scripted.answers = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"40\r\n" + b"x" * 64 + b"\r\n"
    ]
    with pytest.raises(ProxyError) as err:
        await client.fetch("GET", f"{scripted.url}/big", max_bytes=10, egress=LOOPBACK_OK)
    assert (err.value.status, err.value.reason) == (502, "response-too-large")


async def test_an_egress_fetch_is_bounded_in_time_resolution_included(
    scripted: Scripted, client: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted.answers = [b"hang"]
    with pytest.raises(ProxyError) as err:
        await client.fetch("GET", f"{scripted.url}/slow", max_bytes=10, total_s=0.2, egress=LOOPBACK_OK)
    assert (err.value.status, err.value.reason) == (504, "upstream-timeout")

    never = asyncio.Event()

    async def stuck(*_args: object, **_kw: object) -> list[tuple[object, ...]]:
        await never.wait()
        return []

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", stuck)
    with pytest.raises(ProxyError) as err:
        await client.fetch("GET", "https://slow-dns.test/", max_bytes=10, total_s=0.2, egress=EgressPolicy())
    assert (err.value.status, err.value.reason) == (504, "upstream-connect-timeout")


async def test_a_connect_failure_does_not_name_the_address(
    client: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as closed:  # bound, not listening: connecting is refused while the port stays ours
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        resolve_as(monkeypatch, ["127.0.0.1"])
        with pytest.raises(ProxyError) as err:
            await client.fetch("GET", f"http://closed.test:{port}/", max_bytes=10, egress=LOOPBACK_OK)
    assert err.value.reason == "upstream-connect-failed"
    assert "127.0.0.1" not in err.value.detail
    assert err.value.detail.startswith(f"closed.test:{port}: ")


async def test_a_next_hop_carries_a_vetted_egress_fetch(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = resolve_as(monkeypatch, ["93.184.216.34"])
    relay = parse_absolute_uri(scripted.url + "/")
    async with HttpClient.standalone(via=relay) as client:
        answer = await client.fetch("GET", "https://origin.test/d", max_bytes=10, egress=EgressPolicy())
        assert answer.status == 200
        with pytest.raises(EgressError):
            await client.fetch("GET", "https://10.0.0.1/d", max_bytes=10, egress=EgressPolicy())
    assert calls == ["origin.test"]
    assert scripted.heads[0].startswith(b"GET https://origin.test/d HTTP/1.1\r\nHost: origin.test\r\n")
    assert len(scripted.heads) == 1


@pytest.fixture
async def named_tls(
    tmp_path: Path,
) -> AsyncIterator[tuple[Scripted, Path, list[str | None]]]:
    """A TLS server whose only certificate is for ``dir.test``; records the SNI each client sends."""
    names: list[str | None] = []
    ca = CertificateAuthority.generate()
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem())
    with LeafContextCache(ca, 4) as leaves:
        ctx = leaves.get("dir.test")
        ctx.sni_callback = lambda _obj, name, _ctx: names.append(name)  # record; keep the dir.test leaf
        server = Scripted()
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=ctx)
        server.port = listener.sockets[0].getsockname()[1]
        try:
            yield server, tmp_path / "ca.pem", names
        finally:
            listener.close()
            await listener.wait_closed()


async def test_tls_sni_certificate_and_host_are_for_the_name_not_the_vetted_address(
    named_tls: tuple[Scripted, Path, list[str | None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, ca_file, names = named_tls
    calls = resolve_as(monkeypatch, ["127.0.0.1"])
    upstream = UpstreamConfig(pin_ca_files={"dir.test": str(ca_file), "other.test": str(ca_file)})
    async with HttpClient.standalone(upstream, TimeoutsConfig(connect_s=5, read_s=5)) as client:
        answer = await client.fetch(
            "GET", f"https://dir.test:{server.port}/d", max_bytes=10, egress=LOOPBACK_OK
        )
        assert answer.status == 200
        with pytest.raises(ProxyError) as err:  # same address, another name: the certificate must not pass
            await client.fetch("GET", f"https://other.test:{server.port}/d", max_bytes=10, egress=LOOPBACK_OK)
    assert err.value.reason == "upstream-certificate-invalid"
    assert names == ["dir.test", "other.test"]
    assert calls == ["dir.test", "other.test"]
    assert server.heads[0].startswith(f"GET /d HTTP/1.1\r\nHost: dir.test:{server.port}\r\n".encode())
