"""Tests for the interception CA: files and refusals, leaf minting, TLS contexts, the CA bundle."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import ssl
import stat
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from signing_proxy.storage.ca import (
    BACKDATE,
    CAError,
    CertificateAuthority,
    LeafContextCache,
    load_ca,
    load_or_create_ca,
    write_ca_bundle,
)

TIMEOUT_SECONDS = 5.0
NOW = datetime(2030, 1, 15, 12, 0, 0, tzinfo=UTC)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write_pair(directory: Path, cert: x509.Certificate, key_pem: bytes) -> tuple[Path, Path]:
    directory.mkdir(mode=0o700, exist_ok=True)
    cert_path, key_path = directory / "ca.pem", directory / "ca-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key_pem)
    key_path.chmod(0o600)
    return cert_path, key_path


def _self_signed(
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey,
    *,
    ca: bool = True,
    not_before: datetime = NOW - timedelta(days=1),
    not_after: datetime = NOW + timedelta(days=30),
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "operator CA")])
    algorithm = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(key, algorithm)
    )


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority.generate()


@pytest.fixture
def cache(ca: CertificateAuthority) -> Iterator[LeafContextCache]:
    with LeafContextCache(ca) as leaf_cache:
        yield leaf_cache


# -- files and refusals -------------------------------------------------------------------------


def test_first_run_creates_owner_only_files_and_second_run_loads_them(tmp_path: Path) -> None:
    data_dir = tmp_path / "state" / "ca"
    first = load_or_create_ca(data_dir)
    cert_path, key_path = data_dir / "ca.pem", data_dir / "ca-key.pem"
    assert _mode(key_path) == 0o600
    assert _mode(data_dir) == 0o700
    assert _mode(cert_path) == 0o644
    assert not [p.name for p in data_dir.iterdir() if p.name.endswith(".tmp")]
    assert b"BEGIN PRIVATE KEY" in key_path.read_bytes()  # PKCS#8, unencrypted

    second = load_or_create_ca(data_dir)
    assert second.thumbprint_sha256() == first.thumbprint_sha256()
    assert second.cert_pem() == cert_path.read_bytes()
    assert len(first.thumbprint_sha256()) == 64


def test_generated_ca_certificate_profile() -> None:
    ca = CertificateAuthority.generate(validity_days=30, now=NOW)
    cert = ca.cert
    key = cert.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    assert isinstance(key.curve, ec.SECP256R1)
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical
    assert basic.value.ca
    assert basic.value.path_length == 0
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical
    assert usage.value.key_cert_sign
    assert usage.value.crl_sign
    assert not usage.value.digital_signature
    cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    (cn,) = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert isinstance(cn.value, str)
    assert cn.value.startswith("signing-proxy interception CA (")
    assert cert.not_valid_before_utc == NOW - BACKDATE
    assert cert.not_valid_after_utc == NOW + timedelta(days=30)
    cert.verify_directly_issued_by(cert)
    assert "PRIVATE" not in repr(ca)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_refuses_key_readable_by_group_or_others(tmp_path: Path, mode: int) -> None:
    load_or_create_ca(tmp_path)
    (tmp_path / "ca-key.pem").chmod(mode)
    with pytest.raises(CAError) as info:
        load_or_create_ca(tmp_path)
    assert info.value.reason == "ca-key-permissions"
    assert "chmod 600" in info.value.detail


def test_refuses_malformed_key(tmp_path: Path) -> None:
    load_or_create_ca(tmp_path)
    key_path = tmp_path / "ca-key.pem"
    key_path.write_bytes(b"-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n")
    with pytest.raises(CAError) as info:
        load_or_create_ca(tmp_path)
    assert info.value.reason == "ca-malformed"


def test_refuses_malformed_certificate(tmp_path: Path) -> None:
    load_or_create_ca(tmp_path)
    (tmp_path / "ca.pem").write_bytes(b"not a certificate\n")
    with pytest.raises(CAError) as info:
        load_or_create_ca(tmp_path)
    assert info.value.reason == "ca-malformed"


def test_refuses_key_that_does_not_match_the_certificate(tmp_path: Path) -> None:
    load_or_create_ca(tmp_path)
    other_key = _key_pem(ec.generate_private_key(ec.SECP256R1()))
    (tmp_path / "ca-key.pem").write_bytes(other_key)
    with pytest.raises(CAError) as info:
        load_or_create_ca(tmp_path)
    assert info.value.reason == "ca-mismatch"
    assert "PRIVATE" not in str(info.value)


def test_data_dir_refuses_a_ca_that_is_not_p256(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP384R1())
    _write_pair(tmp_path, _self_signed(key), _key_pem(key))
    with pytest.raises(CAError) as info:
        load_or_create_ca(tmp_path, now=NOW)
    assert info.value.reason == "ca-mismatch"


def test_refuses_half_a_pair(tmp_path: Path) -> None:
    load_or_create_ca(tmp_path)
    (tmp_path / "ca.pem").unlink()
    with pytest.raises(CAError) as info:
        load_or_create_ca(tmp_path)
    assert info.value.reason == "ca-missing"
    assert (tmp_path / "ca-key.pem").exists()  # never overwritten


def test_refuses_expired_and_not_yet_valid_ca(tmp_path: Path) -> None:
    old = CertificateAuthority.generate(validity_days=10, now=NOW - timedelta(days=20))
    _write_pair(tmp_path, old.cert, old._ca_key_pem())
    with pytest.raises(CAError) as info:
        load_or_create_ca(tmp_path, now=NOW)
    assert info.value.reason == "ca-expired"
    with pytest.raises(CAError) as info:
        load_or_create_ca(tmp_path, now=NOW - timedelta(days=30))
    assert info.value.reason == "ca-expired"
    assert load_or_create_ca(tmp_path, now=NOW - timedelta(days=15)).thumbprint_sha256() == (
        old.thumbprint_sha256()
    )


def test_refuses_a_certificate_that_is_not_a_ca(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    cert_path, key_path = _write_pair(tmp_path, _self_signed(key, ca=False), _key_pem(key))
    with pytest.raises(CAError) as info:
        load_ca(cert_path, key_path, now=NOW)
    assert info.value.reason == "ca-not-ca"


@pytest.mark.parametrize(
    "make_key",
    [
        lambda: ec.generate_private_key(ec.SECP384R1()),
        lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
        ed25519.Ed25519PrivateKey.generate,
    ],
    ids=["p384", "rsa2048", "ed25519"],
)
def test_operator_supplied_ca_with_other_key_types(tmp_path: Path, make_key: object) -> None:
    assert callable(make_key)
    key = make_key()
    cert_path, key_path = _write_pair(tmp_path, _self_signed(key), _key_pem(key))
    ca = load_ca(cert_path, key_path, now=NOW)
    leaf = x509.load_pem_x509_certificate(ca.mint_leaf("example.test", now=NOW))
    leaf.verify_directly_issued_by(ca.cert)


def test_operator_supplied_ca_key_permissions_are_checked(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    cert_path, key_path = _write_pair(tmp_path, _self_signed(key), _key_pem(key))
    key_path.chmod(0o644)
    with pytest.raises(CAError) as info:
        load_ca(cert_path, key_path, now=NOW)
    assert info.value.reason == "ca-key-permissions"


# -- leaves -------------------------------------------------------------------------------------


def _leaf(ca: CertificateAuthority, host: str, now: datetime = NOW) -> x509.Certificate:
    return x509.load_pem_x509_certificate(ca.mint_leaf(host, now=now))


def test_leaf_for_a_host_name_chains_to_the_ca() -> None:
    ca = CertificateAuthority.generate(now=NOW - timedelta(days=1))
    leaf = _leaf(ca, "Example.TEST.")
    leaf.verify_directly_issued_by(ca.cert)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["example.test"]
    assert san.get_values_for_type(x509.IPAddress) == []
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    basic = leaf.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical
    assert not basic.value.ca
    aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ski.digest
    assert leaf.not_valid_before_utc == NOW - BACKDATE
    assert leaf.not_valid_after_utc == NOW + timedelta(days=7)
    assert ca.cert.not_valid_before_utc <= leaf.not_valid_before_utc
    assert leaf.not_valid_after_utc <= ca.cert.not_valid_after_utc


@pytest.mark.parametrize(
    ("host", "expected"),
    [("127.0.0.1", "127.0.0.1"), ("::1", "::1"), ("[::1]", "::1"), ("2001:DB8::0:1", "2001:db8::1")],
)
def test_leaf_for_an_ip_literal_has_an_ip_san(ca: CertificateAuthority, host: str, expected: str) -> None:
    leaf = x509.load_pem_x509_certificate(ca.mint_leaf(host))
    leaf.verify_directly_issued_by(ca.cert)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address(expected)]
    assert san.get_values_for_type(x509.DNSName) == []


def test_punycode_stays_as_given(ca: CertificateAuthority) -> None:
    leaf = x509.load_pem_x509_certificate(ca.mint_leaf("XN--bcher-kva.example"))
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["xn--bcher-kva.example"]


@pytest.mark.parametrize(
    "host", ["", "bücher.example", "a..b", "-bad.example", "has space", "[nope]", "x" * 254]
)
def test_invalid_hosts_are_refused(ca: CertificateAuthority, host: str) -> None:
    with pytest.raises(CAError) as info:
        ca.mint_leaf(host)
    assert info.value.reason == "leaf-host-invalid"


def test_long_host_name_has_no_cn_and_a_critical_san(ca: CertificateAuthority) -> None:
    host = ".".join(["a" * 60] * 3) + ".example"
    leaf = x509.load_pem_x509_certificate(ca.mint_leaf(host))
    assert leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME) == []
    assert leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).critical


def test_every_leaf_shares_one_key_but_not_a_serial(ca: CertificateAuthority) -> None:
    first, second = (
        _leaf(ca, "a.example.test", datetime.now(UTC)),
        _leaf(ca, "b.example.test", datetime.now(UTC)),
    )
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    assert first.public_key().public_bytes(
        serialization.Encoding.DER, spki
    ) == second.public_key().public_bytes(serialization.Encoding.DER, spki)
    assert first.serial_number != second.serial_number
    key = first.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    assert isinstance(key.curve, ec.SECP256R1)


def test_leaf_validity_is_configurable_and_never_outlives_the_ca() -> None:
    ca = CertificateAuthority.generate(validity_days=3, now=NOW)
    ca.leaf_validity = timedelta(days=1)
    assert _leaf(ca, "example.test").not_valid_after_utc == NOW + timedelta(days=1)
    ca.leaf_validity = timedelta(days=7)
    assert _leaf(ca, "example.test").not_valid_after_utc == ca.not_after
    with pytest.raises(CAError) as info:
        ca.mint_leaf("example.test", now=ca.not_after + timedelta(seconds=1))
    assert info.value.reason == "ca-expired"


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


# -- CA bundle ----------------------------------------------------------------------------------


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty-system.pem"
    path.write_bytes(b"")
    return path


def test_bundle_appends_our_ca_to_the_system_store(tmp_path: Path, ca: CertificateAuthority) -> None:
    system = tmp_path / "system.pem"
    other = CertificateAuthority.generate().cert_pem()
    system.write_bytes(other.rstrip(b"\n"))  # no trailing newline: the bundle must still split
    out = write_ca_bundle(ca, tmp_path / "bundle.pem", system_bundle=system)
    data = out.read_bytes()
    assert data == other + ca.cert_pem()
    assert _mode(out) == 0o644
    context = ssl.create_default_context(cafile=str(out))
    assert len(context.get_ca_certs()) == 2
    # Rewriting from a store that already holds our CA (or from the bundle itself) does not duplicate it.
    assert write_ca_bundle(ca, out, system_bundle=out).read_bytes().count(ca.cert_pem()) == 1


def test_bundle_from_the_default_system_store(tmp_path: Path, ca: CertificateAuthority) -> None:
    out = write_ca_bundle(ca, tmp_path / "bundle.pem")
    data = out.read_bytes()
    assert data.endswith(ca.cert_pem())
    context = ssl.create_default_context(cafile=str(out))
    assert ca.cert.public_bytes(serialization.Encoding.DER) in context.get_ca_certs(binary_form=True)
    assert _mode(out) == 0o644
