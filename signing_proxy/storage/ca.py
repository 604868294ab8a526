"""The interception CA: a local certificate authority that mints per-host leaf certificates.

For ``HTTPS_PROXY`` traffic the proxy answers ``CONNECT`` and terminates TLS itself, presenting a leaf
certificate for the requested host that it mints on the fly, so it can read and sign the inner
requests. The agent trusts those leaves because it trusts our CA (``write_ca_bundle`` produces the
file for ``SSL_CERT_FILE``/``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``). The generated CA is ECDSA P-256,
stored owner-only in the data directory (``ca.pem`` + ``ca-key.pem``); an operator may supply their
own CA instead (``load_ca``). Every leaf of one ``CertificateAuthority`` shares one ECDSA P-256 key,
generated in memory and never written to the data directory, so minting a leaf costs one signature.
The TLS contexts built from those leaves (an LRU, SNI selection) are ``net/leaves.py``'s.

Errors that refuse a CA are ``CAError(reason, detail)``; the detail never contains key material.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import secrets
import socket
import ssl
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..errors import CAError
from .certs import aki_for_issuer, as_utc, check_is_ca, check_key_type, parse_host, signature_hash, spki
from .files import (
    PRIVATE_FILE_MODE,
    PUBLIC_FILE_MODE,
    PrivateFileError,
    file_lock,
    make_private_dir,
    read_private,
    write_atomic,
)

__all__ = [
    "BACKDATE",
    "CA_CERT_FILENAME",
    "CA_EXPIRY_WARNING",
    "CA_KEY_FILENAME",
    "CA_VALIDITY_DAYS",
    "LEAF_VALIDITY",
    "CAError",
    "CertificateAuthority",
    "load_ca",
    "load_or_create_ca",
    "write_ca_bundle",
]

log = logging.getLogger(__name__)

CA_CERT_FILENAME: Final = "ca.pem"
CA_KEY_FILENAME: Final = "ca-key.pem"
CA_LOCK_FILENAME: Final = ".ca.lock"
CA_VALIDITY_DAYS: Final = 365
CA_EXPIRY_WARNING: Final = timedelta(days=30)  # log a warning when the CA expires sooner than this
LEAF_VALIDITY: Final = timedelta(days=7)
BACKDATE: Final = timedelta(hours=1)  # not_before is set this far in the past, for clock skew
CN_MAX_CHARS: Final = 64  # X.520 ub-common-name

_CA_CN_PREFIX: Final = "signing-proxy interception CA"


def _check_validity(cert: x509.Certificate, now: datetime) -> None:
    not_before, not_after = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now >= not_after:
        raise CAError("ca-expired", f"the CA certificate expired at {not_after.isoformat()}")
    if now < not_before:
        raise CAError("ca-expired", f"the CA certificate is not valid before {not_before.isoformat()}")
    if not_after - now < CA_EXPIRY_WARNING:
        log.warning("interception CA expires soon, at %s", not_after.isoformat())


class CertificateAuthority:
    """A CA certificate with its private key, and the one leaf key every minted leaf shares.

    Construction checks that the key is usable and matches the certificate and that the
    certificate is a CA; expiry is checked by the loaders and at minting time.
    """

    def __init__(
        self,
        cert: x509.Certificate,
        key: object,
        *,
        leaf_validity: timedelta = LEAF_VALIDITY,
        require_p256: bool = False,
    ) -> None:
        checked = check_key_type(key, require_p256=require_p256)
        if spki(checked) != spki(cert):
            raise CAError("ca-mismatch", "the CA private key does not match the CA certificate")
        check_is_ca(cert)
        self._cert = cert
        self._key = checked
        self._hash = signature_hash(checked)
        self._cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        self._thumbprint = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()
        self._aki = aki_for_issuer(cert)
        self.leaf_validity = leaf_validity
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_ski = x509.SubjectKeyIdentifier.from_public_key(self._leaf_key.public_key())

    @classmethod
    def generate(
        cls,
        *,
        validity_days: int = CA_VALIDITY_DAYS,
        common_name: str | None = None,
        now: datetime | None = None,
    ) -> CertificateAuthority:
        """A new self-signed ECDSA P-256 CA, valid from ``now - BACKDATE`` for ``validity_days``."""
        if validity_days < 1:
            raise ValueError("validity_days must be at least 1")
        start = as_utc(now).replace(microsecond=0)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "signing-proxy"),
                x509.NameAttribute(NameOID.COMMON_NAME, common_name or _default_ca_common_name()),
            ]
        )
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start - BACKDATE)
            .not_valid_after(start + timedelta(days=validity_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(ski, critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key, require_p256=True)

    @property
    def cert(self) -> x509.Certificate:
        return self._cert

    @property
    def not_after(self) -> datetime:
        return self._cert.not_valid_after_utc

    @property
    def leaf_validity(self) -> timedelta:
        """Lifetime of newly minted leaves (before the backdate; never past the CA's not_after)."""
        return self._leaf_validity

    @leaf_validity.setter
    def leaf_validity(self, value: timedelta) -> None:
        if value <= timedelta(0):
            raise ValueError("leaf_validity must be positive")
        self._leaf_validity = value

    def cert_pem(self) -> bytes:
        return self._cert_pem

    def thumbprint_sha256(self) -> str:
        """SHA-256 over the CA certificate's DER, lowercase hex without separators."""
        return self._thumbprint

    def __repr__(self) -> str:
        return f"<CertificateAuthority {self._cert.subject.rfc4514_string()} sha256={self._thumbprint}>"

    def mint_leaf(self, host: str, *, now: datetime | None = None) -> bytes:
        """A PEM leaf certificate for ``host`` (a DNS name or an IPv4/IPv6 literal)."""
        return self.mint_leaf_with_expiry(host, as_utc(now))[0]

    def mint_leaf_with_expiry(self, host: str, now: datetime) -> tuple[bytes, datetime]:
        """The PEM leaf for ``host`` minted at ``now`` (aware, UTC), and its not_after."""
        name, san = parse_host(host)
        now = now.replace(microsecond=0)
        not_before = max(now - BACKDATE, self._cert.not_valid_before_utc)
        not_after = min(now + self._leaf_validity, self.not_after)
        if not_after <= now:
            raise CAError("ca-expired", f"the CA certificate expired at {self.not_after.isoformat()}")
        subject = x509.Name(
            [x509.NameAttribute(NameOID.COMMON_NAME, name)] if len(name) <= CN_MAX_CHARS else []
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._cert.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([san]), critical=not subject)
            .add_extension(self._leaf_ski, critical=False)
            .add_extension(self._aki, critical=False)
            .sign(self._key, self._hash)
        )
        return cert.public_bytes(serialization.Encoding.PEM), not_after

    def leaf_key_pem(self) -> bytes:
        """The private key every leaf shares (PKCS#8 PEM): held in memory, never written to disk."""
        return self._leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def _ca_key_pem(self) -> bytes:
        return self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


def _default_ca_common_name() -> str:
    room = CN_MAX_CHARS - len(_CA_CN_PREFIX) - len(" ( 123456)")
    host = re.sub(r"[^A-Za-z0-9.-]", "", socket.gethostname().split(".")[0])[:room]
    tag = secrets.token_hex(3)
    return f"{_CA_CN_PREFIX} ({host} {tag})" if host else f"{_CA_CN_PREFIX} ({tag})"


# -- files -------------------------------------------------------------------------------------


def _read_key_file(key_path: Path) -> bytes:
    """Read a private key file, refusing one that anybody but its owner can access."""
    try:
        return read_private(key_path)
    except PrivateFileError as exc:
        if exc.reason == "missing":
            raise CAError("ca-missing", f"CA key file {key_path} does not exist") from None
        if exc.reason == "denied":
            raise CAError(
                "ca-key-permissions", f"CA key file {key_path} is not readable by this user"
            ) from None
        if exc.reason == "wrong-kind":
            raise CAError("ca-malformed", f"CA key file {key_path} is not a regular file") from None
        if exc.reason == "too-open":
            raise CAError(
                "ca-key-permissions",
                f"CA key file {key_path} has mode {exc.mode:04o}; "
                f"it must be accessible by its owner only (chmod 600)",
            ) from None
        if exc.os_error is not None:  # unreadable: the OSError itself (callers say ca-unavailable)
            raise exc.os_error from None
        raise


def load_ca(
    cert_path: Path,
    key_path: Path,
    *,
    leaf_validity: timedelta = LEAF_VALIDITY,
    now: datetime | None = None,
) -> CertificateAuthority:
    """Load an operator-supplied CA: a PEM certificate and an unencrypted PEM private key.

    The key may be ECDSA (P-256/P-384/P-521), RSA (>= 2048 bits), Ed25519 or Ed448. Raises
    ``CAError`` when the key file is accessible by group/others (``ca-key-permissions``), a file is
    missing (``ca-missing``) or malformed (``ca-malformed``), key and certificate do not match or the
    key type is unsupported (``ca-mismatch``), or the certificate is not a CA (``ca-not-ca``) or is
    outside its validity period (``ca-expired``).
    """
    return _load_pair(Path(cert_path), Path(key_path), leaf_validity, as_utc(now), require_p256=False)


def _load_pair(
    cert_path: Path, key_path: Path, leaf_validity: timedelta, now: datetime, *, require_p256: bool
) -> CertificateAuthority:
    key_pem = _read_key_file(key_path)
    try:
        cert_pem = cert_path.read_bytes()
    except FileNotFoundError:
        raise CAError("ca-missing", f"CA certificate file {cert_path} does not exist") from None
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise CAError("ca-malformed", f"CA certificate file {cert_path} is not a PEM certificate") from exc
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise CAError(
            "ca-malformed", f"CA key file {key_path} is encrypted; supply an unencrypted key"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise CAError("ca-malformed", f"CA key file {key_path} is not a PEM private key") from None
    ca = CertificateAuthority(cert, key, leaf_validity=leaf_validity, require_p256=require_p256)
    _check_validity(cert, now)
    return ca


def load_or_create_ca(
    data_dir: Path,
    *,
    validity_days: int = CA_VALIDITY_DAYS,
    leaf_validity: timedelta = LEAF_VALIDITY,
    now: datetime | None = None,
) -> CertificateAuthority:
    """Load the CA kept in ``data_dir`` (``ca.pem``, ``ca-key.pem``), creating it on first run.

    A new CA is ECDSA P-256, valid ``validity_days``; its key is written PKCS#8, unencrypted, mode
    0600, and ``data_dir`` is created 0700 when missing. An existing CA is never replaced: it is
    refused with ``CAError`` when its key is accessible by group/others (``ca-key-permissions``),
    a file is malformed (``ca-malformed``) or one of the pair is missing (``ca-missing``), the key is
    not P-256 or does not match (``ca-mismatch``), or the certificate is not a CA (``ca-not-ca``) or
    is expired (``ca-expired``); delete both files to make a new CA (agents must then trust it anew).
    """
    data_dir = Path(data_dir)
    if not make_private_dir(data_dir) and data_dir.stat().st_mode & 0o022:
        log.warning("data directory %s is writable by group or others", data_dir)
    cert_path, key_path = data_dir / CA_CERT_FILENAME, data_dir / CA_KEY_FILENAME
    with file_lock(data_dir / CA_LOCK_FILENAME):
        have_cert, have_key = cert_path.exists(), key_path.exists()
        if have_cert or have_key:
            if not (have_cert and have_key):
                present, missing = (cert_path, key_path) if have_cert else (key_path, cert_path)
                raise CAError(
                    "ca-missing",
                    f"{present} exists but {missing} does not; restore it, or delete {present} "
                    "to generate a new CA",
                )
            ca = _load_pair(cert_path, key_path, leaf_validity, as_utc(now), require_p256=True)
            log.info("loaded interception CA %s sha256=%s", cert_path, ca.thumbprint_sha256())
            return ca
        ca = CertificateAuthority.generate(validity_days=validity_days, now=now)
        ca.leaf_validity = leaf_validity
        write_atomic(key_path, ca._ca_key_pem(), PRIVATE_FILE_MODE)
        write_atomic(cert_path, ca.cert_pem(), PUBLIC_FILE_MODE)
    log.info(
        "created interception CA %s sha256=%s valid until %s",
        cert_path,
        ca.thumbprint_sha256(),
        ca.not_after.isoformat(),
    )
    return ca


# -- CA bundle ---------------------------------------------------------------------------------


def _system_bundle_candidates() -> Iterator[Path]:
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate:
            yield Path(candidate)
    try:
        import certifi  # noqa: PLC0415 (optional: a trust store when OpenSSL has none)
    except ImportError:
        return
    yield Path(certifi.where())


def write_ca_bundle(ca: CertificateAuthority, out_path: Path, *, system_bundle: Path | None = None) -> Path:
    """Write the system trust store followed by our CA certificate to ``out_path`` (mode 0644).

    ``system_bundle`` defaults to OpenSSL's default CA file (``SSL_CERT_FILE`` or the compiled-in
    path), then ``certifi``'s; with none found the bundle holds our CA alone. A source that is
    ``out_path`` itself is skipped and copies of our certificate are dropped, so rewriting is idempotent.
    """
    out_path = Path(out_path)
    ours = ca.cert_pem()
    system = b""
    candidates = [Path(system_bundle)] if system_bundle is not None else list(_system_bundle_candidates())
    for candidate in candidates:
        with contextlib.suppress(OSError):
            if out_path.exists() and candidate.samefile(out_path):
                continue
        try:
            system = candidate.read_bytes()
        except OSError:
            if system_bundle is not None:
                raise
            continue
        break
    system = system.replace(ours, b"")
    if system and not system.endswith(b"\n"):
        system += b"\n"
    write_atomic(out_path, system + ours, PUBLIC_FILE_MODE)
    return out_path
