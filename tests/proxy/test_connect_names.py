"""The name a CONNECT names: a fully qualified one (``a.example.``) is the name without its root dot,
for the SNI check, the leaf and the tunnel rules alike (it was refused whatever SNI came, or, with
none, met an upstream certificate check against ``a.example.``)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.errors import ProxyError
from signing_proxy.net.request import parse_connect_target
from signing_proxy.service.app import ProxyApp
from tests.harness import WAIT_S


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ("a.example:443", ("a.example", 443)),
        ("A.Example.:8443", ("a.example", 8443)),
        ("[::1]:443", ("[::1]", 443)),
    ],
)
def test_a_connect_target_names_its_host_without_the_root_dot(raw: str, parsed: tuple[str, int]) -> None:
    assert parse_connect_target(raw) == parsed


@pytest.mark.parametrize(
    "raw",
    [
        "a.example",  # no port at all (it passed the empty-port check of 0827eae and dialled :443)
        "a.example:",  # an empty port (RFC 9110 section 9.3.6: MUST reject); it dialled :443
        "[::1]:",
        "u:p@a.example",  # userinfo and no port: the ':' in it passed for the port's
        "u@a.example:443",
        "[fe80::1%25eth0]:443",  # an IPv6 zone identifier: meaningless to any peer but us
        "[fe80::1%eth0]:443",
    ],
)
def test_a_connect_target_that_is_not_host_and_port_is_refused(raw: str) -> None:
    with pytest.raises(ProxyError) as caught:
        parse_connect_target(raw)
    assert (caught.value.status, caught.value.reason) == (400, "malformed-target")


async def handshake(port: int, ca_pem: str, connect_host: str, sni: str | None) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"CONNECT {connect_host}:443 HTTP/1.1\r\nHost: {connect_host}\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        assert head.startswith(b"HTTP/1.1 200 ")
        context = ssl.create_default_context(cadata=ca_pem)
        context.check_hostname = False
        try:
            await asyncio.wait_for(writer.start_tls(context, server_hostname=sni), WAIT_S)
        except ssl.SSLError as exc:
            return f"refused: {exc.reason}"
        name = writer.get_extra_info("ssl_object").getpeercert()["subjectAltName"]
        return f"leaf {name}"
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("connect_host", "sni", "outcome"),
    [
        ("A.EXAMPLE.", "a.example", "leaf (('DNS', 'a.example'),)"),
        ("a.example.", "a.example.", "leaf (('DNS', 'a.example'),)"),
        ("a.example.", "b.example", "refused: TLSV1_UNRECOGNIZED_NAME"),
    ],
)
async def test_a_fully_qualified_connect_is_intercepted_as_its_name(
    tmp_path: Path, connect_host: str, sni: str, outcome: str
) -> None:
    config = parse_config({"listen": "127.0.0.1:0", "data_dir": str(tmp_path), "log": {"access_log": False}})
    app = ProxyApp(config, StaticKeyProvider(SigningKey.generate()))
    [(_host, port)] = await app.start()
    try:
        assert app.interception.ca is not None
        assert await handshake(port, app.interception.ca.cert_pem().decode(), connect_host, sni) == outcome
    finally:
        await app.stop(drain_s=0)
