"""``upstream.pin_ca_files`` applies to its host however the pin or the target spells it.

Targets arrive as ``https://[0:0::1]/``, ``https://API.internal./``, ``CONNECT API.internal.:443``;
a pin may be written ``::1`` or ``API.internal.``. The pool looked pins up by the exact lower-cased
key, so most spellings found none and the host was verified against the system store plus
``ca_file``: a pin silently weakened. Here each spelling must find the pin, and against a TLS origin
whose CA is in no store but the pin, the connection must be verified with that CA alone.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from signing_proxy.config import ConfigError, TimeoutsConfig, UpstreamConfig, parse_config
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.errors import ProxyError
from signing_proxy.net.client import HttpClient
from signing_proxy.net.dial import client_tls_context
from signing_proxy.net.leaves import LeafContextCache
from signing_proxy.net.request import parse_connect_target
from signing_proxy.net.upstream import UpstreamPool
from signing_proxy.storage.ca import CertificateAuthority

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
TIMEOUTS = TimeoutsConfig(connect_s=5, read_s=5)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[CertificateAuthority, str]:
    """A CA in no trust store: only a pin makes its leaves verify."""
    authority = CertificateAuthority.generate()
    path = tmp_path_factory.mktemp("pin") / "ca.pem"
    path.write_bytes(authority.cert_pem())
    return authority, str(path)


def pool_for(pins: dict[str, str]) -> UpstreamPool:
    upstream = parse_config({"upstream": {"pin_ca_files": pins}}).upstream
    return UpstreamPool(upstream, connect_timeout_s=1, read_timeout_s=1)


V6_KEYS = ["::1", "[::1]", "[0:0::1]", "[0000:0000:0000:0000:0000:0000:0000:0001]"]
V6_TARGETS = ["https://[::1]/", "https://[0:0::1]:8443/x", "https://[0000::0001]/", "CONNECT [0:0::1]:443"]
NAME_KEYS = ["api.internal", "API.internal", "api.internal.", "Api.Internal."]
NAME_TARGETS = [
    "https://api.internal/",
    "https://API.Internal./x",
    "https://api.internal.:8443/",
    "CONNECT API.internal.:443",
    "CONNECT api.internal:8443",
]


def target_host(target: str) -> str:
    """The host the pool is given for ``target``: an absolute URI's, or a CONNECT's (``proxy.connect``)."""
    if target.startswith("CONNECT "):
        return parse_connect_target(target.removeprefix("CONNECT "))[0]
    return parse_absolute_uri(target).host


@pytest.mark.parametrize(
    ("key", "target"),
    [(k, t) for k in V6_KEYS for t in V6_TARGETS] + [(k, t) for k in NAME_KEYS for t in NAME_TARGETS],
)
def test_a_pin_applies_to_every_spelling_of_its_host(
    ca: tuple[CertificateAuthority, str], key: str, target: str
) -> None:
    pool = pool_for({key: ca[1]})
    assert pool._tls_for(target_host(target)) is client_tls_context(only=ca[1])


@pytest.mark.parametrize(
    "target",
    [
        "https://[::2]/",
        "https://127.0.0.1/",
        "https://other.internal/",
        "https://api.internal.evil/",
        "https://x.api.internal/",
        "CONNECT internal:443",
    ],
)
def test_another_host_keeps_the_default_trust(ca: tuple[CertificateAuthority, str], target: str) -> None:
    pool = pool_for({"::1": ca[1], "api.internal": ca[1]})
    assert pool._tls_for(target_host(target)) is client_tls_context(None)


def test_a_pool_built_from_code_refuses_a_key_it_would_never_apply(
    ca: tuple[CertificateAuthority, str],
) -> None:
    """The library's callers build UpstreamConfig themselves (no config file, no _check)."""
    with pytest.raises(ConfigError, match=r"upstream\.pin_ca_files\['api\.internal:443'\]: must be one host"):
        UpstreamPool(
            UpstreamConfig(pin_ca_files={"api.internal:443": ca[1]}), connect_timeout_s=1, read_timeout_s=1
        )


# --- against a TLS origin whose CA is only in the pin -------------------------------------------------


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(OK)
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


@asynccontextmanager
async def origin(ca: CertificateAuthority, name: str, address: str) -> AsyncIterator[int]:
    """A TLS origin on ``address`` whose one certificate is for ``name``; yields its port."""
    with LeafContextCache(ca, 2) as leaves:
        listener = await asyncio.start_server(answer, address, 0, ssl=leaves.get(name))
        try:
            yield listener.sockets[0].getsockname()[1]
        finally:
            listener.close()
            await listener.wait_closed()


async def status(upstream: UpstreamConfig, url: str) -> int | str:
    async with HttpClient.standalone(upstream, TIMEOUTS) as client:
        try:
            return (await client.fetch("GET", url, max_bytes=10)).status
        except ProxyError as exc:
            return exc.reason


@pytest.mark.parametrize("key", ["::1", "[0:0::1]", "[::1]"])
async def test_an_ipv6_origin_is_verified_with_its_pin_in_any_spelling(
    ca: tuple[CertificateAuthority, str], key: str
) -> None:
    upstream = parse_config({"upstream": {"pin_ca_files": {key: ca[1]}}}).upstream
    async with origin(ca[0], "[::1]", "::1") as port:
        for url in (f"https://[::1]:{port}/", f"https://[0:0::1]:{port}/", f"https://[0::0:1]:{port}/x"):
            assert await status(upstream, url) == 200, url
        # the control: the CA is in no store, so without the pin the origin is refused
        assert await status(UpstreamConfig(), f"https://[::1]:{port}/") == "upstream-certificate-invalid"


def resolve_to_loopback(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """This loop's ``getaddrinfo`` answers 127.0.0.1 for any name; returns the names asked."""
    asked: list[str] = []

    async def fake(host: str, port: int, **_kw: object) -> list[tuple[object, ...]]:
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", fake)
    return asked


# A target spelled with a root dot (https://api.internal./) finds the pin too (above), but its TLS
# name check is for "api.internal." (net.dial), which no certificate names: it fails closed either way.
@pytest.mark.parametrize("key", ["api.internal", "API.internal", "api.internal.", "API.Internal."])
async def test_a_named_origin_is_verified_with_its_pin_in_any_spelling(
    ca: tuple[CertificateAuthority, str], key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = parse_config({"upstream": {"pin_ca_files": {key: ca[1]}}}).upstream
    async with origin(ca[0], "api.internal", "127.0.0.1") as port:
        asked = resolve_to_loopback(monkeypatch)
        for url in (f"https://api.internal:{port}/", f"https://API.Internal:{port}/x"):
            assert await status(upstream, url) == 200, url
        assert asked == ["api.internal", "api.internal"]  # the name was the one connected to
        assert (
            await status(UpstreamConfig(), f"https://api.internal:{port}/") == "upstream-certificate-invalid"
        )


async def test_a_pin_for_another_host_does_not_vouch_for_this_one(
    ca: tuple[CertificateAuthority, str], tmp_path: Path
) -> None:
    """A pin is the only CA for its host, in any spelling: the ``upstream.ca_file`` that vouches for
    this origin does not once the host is pinned to another CA. (The origin's CA in no store at all
    would be refused whether the pin applied or not: this test could not fail.)"""
    other = CertificateAuthority.generate()
    (tmp_path / "other.pem").write_bytes(other.cert_pem())
    pins = {"::1": str(tmp_path / "other.pem")}  # a missed pin fell back to ca_file: 200
    upstream = parse_config({"upstream": {"ca_file": ca[1], "pin_ca_files": pins}}).upstream
    async with origin(ca[0], "[::1]", "::1") as port:
        assert await status(upstream, f"https://[0:0::1]:{port}/") == "upstream-certificate-invalid"
