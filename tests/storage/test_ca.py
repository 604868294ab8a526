"""The interception CA: files and refusals, leaf minting, the CA bundle (TLS contexts: tests/net)."""

from __future__ import annotations

import ipaddress
import ssl
import stat
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
