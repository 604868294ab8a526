"""TLS contexts for intercepted tunnels: handshakes with SNI selection, the LRU bound, re-minting,
and where the shared leaf key lives (memfd or a private temp dir)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from signing_proxy.net.leaves import LeafContextCache
from signing_proxy.storage.ca import CertificateAuthority, write_ca_bundle

TIMEOUT_SECONDS = 5.0


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty-system.pem"
    path.write_bytes(b"")
    return path


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority.generate()


# -- TLS ----------------------------------------------------------------------------------------


def _client_context(cafile: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(cafile))
    context.verify_flags |= ssl.VERIFY_X509_STRICT  # Python 3.13's default; our certificates pass it
    context.set_alpn_protocols(["h2", "http/1.1"])
    return context


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        line = await asyncio.wait_for(reader.readline(), TIMEOUT_SECONDS)
        writer.write(b"echo " + line)
        await asyncio.wait_for(writer.drain(), TIMEOUT_SECONDS)
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await asyncio.wait_for(writer.wait_closed(), TIMEOUT_SECONDS)


async def _exchange(
    port: int, client: ssl.SSLContext, server_hostname: str
) -> tuple[bytes, dict[str, object]]:
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname=server_hostname),
        TIMEOUT_SECONDS,
    )
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        assert isinstance(ssl_object, ssl.SSLObject)
        writer.write(b"hello\n")
        await asyncio.wait_for(writer.drain(), TIMEOUT_SECONDS)
        reply = await asyncio.wait_for(reader.readline(), TIMEOUT_SECONDS)
        peer = ssl_object.getpeercert()
        info: dict[str, object] = {
            "alpn": ssl_object.selected_alpn_protocol(),
            "version": ssl_object.version(),
            "san": peer["subjectAltName"] if peer else None,
        }
        return reply, info
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await asyncio.wait_for(writer.wait_closed(), TIMEOUT_SECONDS)


async def test_tls_handshake_with_sni_selection(tmp_path: Path, ca: CertificateAuthority) -> None:
    bundle = write_ca_bundle(ca, tmp_path / "bundle.pem", system_bundle=_empty(tmp_path))
    with LeafContextCache(ca) as cache:
        # How the CONNECT handler selects the leaf: a server context whose sni_callback swaps
        # ssl_object.context for cache.get(server_name). new_base_context() has no certificate of
        # its own; cache.get(connect_host) is the same thing with a fallback for clients without SNI.
        server = await asyncio.start_server(_echo, "127.0.0.1", 0, ssl=cache.new_base_context())
        try:
            port = server.sockets[0].getsockname()[1]
            reply, info = await _exchange(port, _client_context(bundle), "example.test")
            assert reply == b"echo hello\n"
            assert info["alpn"] == "http/1.1"
            assert info["version"] in {"TLSv1.2", "TLSv1.3"}
            assert info["san"] == (("DNS", "example.test"),)
            assert "example.test" in cache
            reply, info = await _exchange(port, _client_context(tmp_path / "bundle.pem"), "other.test")
            assert info["san"] == (("DNS", "other.test"),)
            assert cache.misses == 2
        finally:
            server.close()
            await asyncio.wait_for(server.wait_closed(), TIMEOUT_SECONDS)


async def test_tls_connect_host_context_serves_clients_without_sni(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.cert_pem())
    with LeafContextCache(ca) as cache:
        # CONNECT 127.0.0.1:443: clients send no SNI for IP literals, so the CONNECT host decides.
        server = await asyncio.start_server(_echo, "127.0.0.1", 0, ssl=cache.get("127.0.0.1"))
        try:
            port = server.sockets[0].getsockname()[1]
            reply, info = await _exchange(port, _client_context(ca_file), "127.0.0.1")
            assert reply == b"echo hello\n"
            assert info["san"] == (("IP Address", "127.0.0.1"),)
            # ... and a client that does send SNI still gets the leaf it asked for.
            _, info = await _exchange(port, _client_context(ca_file), "sni.example.test")
            assert info["san"] == (("DNS", "sni.example.test"),)
        finally:
            server.close()
            await asyncio.wait_for(server.wait_closed(), TIMEOUT_SECONDS)


async def test_tls_client_that_does_not_trust_the_ca_fails(tmp_path: Path, ca: CertificateAuthority) -> None:
    stranger = tmp_path / "stranger.pem"
    stranger.write_bytes(CertificateAuthority.generate().cert_pem())
    with LeafContextCache(ca) as cache:
        server = await asyncio.start_server(_echo, "127.0.0.1", 0, ssl=cache.get("example.test"))
        try:
            port = server.sockets[0].getsockname()[1]
            with pytest.raises(ssl.SSLCertVerificationError):
                await _exchange(port, _client_context(stranger), "example.test")
        finally:
            server.close()
            await asyncio.wait_for(server.wait_closed(), TIMEOUT_SECONDS)


async def test_tls_handshake_refused_for_an_invalid_sni(tmp_path: Path, ca: CertificateAuthority) -> None:
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.cert_pem())
    client = _client_context(ca_file)
    client.check_hostname = False  # lets us send an SNI that is not a valid host name
    with LeafContextCache(ca) as cache:
        server = await asyncio.start_server(_echo, "127.0.0.1", 0, ssl=cache.new_base_context())
        try:
            port = server.sockets[0].getsockname()[1]
            # The server answers with an unrecognized_name alert and drops the connection.
            with pytest.raises((ssl.SSLError, ConnectionError)):
                await _exchange(port, client, "bad_label-.example")
        finally:
            server.close()
            await asyncio.wait_for(server.wait_closed(), TIMEOUT_SECONDS)


# -- cache --------------------------------------------------------------------------------------


def test_lru_bound_evicts_the_least_recently_used(ca: CertificateAuthority) -> None:
    with LeafContextCache(ca, max_entries=2) as cache:
        first = cache.get("one.test")
        cache.get("two.test")
        assert cache.get("ONE.test.") is first
        assert cache.hits == 1
        cache.get("three.test")  # evicts two.test, the least recently used
        assert len(cache) == 2
        assert cache.evictions == 1
        assert "two.test" not in cache
        assert cache.get("one.test") is first
        assert cache.hits == 2
        misses = cache.misses
        cache.get("two.test")
        assert cache.misses == misses + 1
        assert cache.evictions == 2
        assert (cache.hits, cache.misses, len(cache)) == (2, 4, 2)


def test_lru_first_host_evicted_when_not_reused(ca: CertificateAuthority) -> None:
    with LeafContextCache(ca, max_entries=2) as cache:
        for host in ("a.test", "b.test", "c.test"):
            cache.get(host)
        assert (len(cache), cache.evictions, cache.misses, cache.hits) == (2, 1, 3, 0)
        cache.get("a.test")
        assert (cache.misses, cache.hits) == (4, 0)
        cache.get("c.test")
        assert cache.hits == 1


def test_contexts_are_reminted_after_half_their_lifetime(ca: CertificateAuthority) -> None:
    clock = [datetime.now(UTC)]
    with LeafContextCache(ca, clock=lambda: clock[0]) as cache:
        first = cache.get("example.test")
        clock[0] += timedelta(days=3)
        assert cache.get("example.test") is first
        clock[0] += timedelta(days=1)
        assert cache.get("example.test") is not first
        assert (cache.hits, cache.misses, cache.evictions, len(cache)) == (1, 2, 0, 1)


@pytest.mark.parametrize("use_memfd", [True, False], ids=["memfd", "tempdir"])
def test_key_storage_is_private_and_removed_on_close(ca: CertificateAuthority, use_memfd: bool) -> None:
    if use_memfd and not hasattr(os, "memfd_create"):
        pytest.skip("no memfd on this platform")
    cache = LeafContextCache(ca, use_memfd=use_memfd)
    try:
        assert cache.storage == ("memfd" if use_memfd else "tempdir")
        cache.get("example.test")
        directory = cache.temp_dir
        if use_memfd:
            assert directory is None
        else:
            assert directory is not None
            assert _mode(Path(directory)) == 0o700
            files = list(Path(directory).iterdir())
            assert [p.name for p in files] == ["leaf-key.pem"]  # chain files are gone after loading
            assert _mode(files[0]) == 0o600
    finally:
        cache.close()
    if not use_memfd:
        assert directory is not None
        assert not Path(directory).exists()
    with pytest.raises(RuntimeError):
        cache.get("example.test")
