"""The interception CA: a local certificate authority, per-host leaf certificates and their TLS contexts.

For ``HTTPS_PROXY`` traffic the proxy answers ``CONNECT`` and terminates TLS itself, presenting a leaf
certificate for the requested host that it mints on the fly, so it can read and sign the inner
requests. The agent trusts those leaves because it trusts our CA (``write_ca_bundle`` produces the
file for ``SSL_CERT_FILE``/``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``). The generated CA is ECDSA P-256,
stored owner-only in the data directory (``ca.pem`` + ``ca-key.pem``); an operator may supply their
own CA instead (``load_ca``). Every leaf of one ``CertificateAuthority`` shares one ECDSA P-256 key,
generated in memory and never written to the data directory, so minting a leaf costs one signature.

``LeafContextCache`` turns leaves into server-side ``ssl.SSLContext`` objects, bounded by an LRU.
Every context it hands out carries ``sni_callback = cache.sni_callback``: use
``cache.get(connect_host)`` as the server context of an intercepted CONNECT tunnel and the leaf
follows the SNI the client sends, while clients that send no SNI (IP-literal targets) get the leaf of
the CONNECT host. The stdlib has no API that loads a certificate chain or private key from memory
(``cadata`` exists only for trust anchors), so the PEM reaches OpenSSL through a path: an anonymous
``memfd`` (Linux; nothing touches a disk) or, where that is unavailable, 0600 files in a private 0700
temporary directory removed by ``close()``.

Errors that refuse a CA are ``CAError(reason, detail)``; the detail never contains key material.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import logging
import os
import re
import secrets
import shutil
import socket
import ssl
import stat
import sys
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final, TypeAlias

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

if sys.platform != "win32":
    import fcntl

from ..errors import CAError

__all__ = [
    "BACKDATE",
    "CA_CERT_FILENAME",
    "CA_EXPIRY_WARNING",
    "CA_KEY_FILENAME",
    "CA_VALIDITY_DAYS",
    "LEAF_CACHE_MAX_ENTRIES",
    "LEAF_VALIDITY",
    "CAError",
    "CertificateAuthority",
    "LeafContextCache",
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
LEAF_CACHE_MAX_ENTRIES: Final = 1024
MIN_RSA_KEY_BITS: Final = 2048
CN_MAX_CHARS: Final = 64  # X.520 ub-common-name
DNS_NAME_MAX_CHARS: Final = 253
KEY_FILE_MODE: Final = 0o600
CERT_FILE_MODE: Final = 0o644
DATA_DIR_MODE: Final = 0o700
GROUP_OTHER_BITS: Final = 0o077

_CA_CN_PREFIX: Final = "signing-proxy interception CA"
_DNS_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_SUPPORTED_CURVES: Final = (ec.SECP256R1, ec.SECP384R1, ec.SECP521R1)

_IssuerKey: TypeAlias = (
    ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey
)
_Hash: TypeAlias = hashes.SHA256 | hashes.SHA384 | hashes.SHA512


def _utcnow(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(UTC)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now.astimezone(UTC)


def _signature_hash(key: _IssuerKey) -> _Hash | None:
    """The digest to sign with: matched to the curve for ECDSA, SHA-256 for RSA, none for EdDSA."""
    if isinstance(key, ec.EllipticCurvePrivateKey):
        if isinstance(key.curve, ec.SECP384R1):
            return hashes.SHA384()
        if isinstance(key.curve, ec.SECP521R1):
            return hashes.SHA512()
        return hashes.SHA256()
    if isinstance(key, rsa.RSAPrivateKey):
        return hashes.SHA256()
    return None


def _spki(key: x509.Certificate | _IssuerKey) -> bytes:
    public = key.public_key()
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _check_key_type(key: object, *, require_p256: bool) -> _IssuerKey:
    if require_p256:
        if isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
            return key
        raise CAError("ca-mismatch", f"the generated CA key must be ECDSA P-256, found {_key_kind(key)}")
    if isinstance(key, ec.EllipticCurvePrivateKey):
        if isinstance(key.curve, _SUPPORTED_CURVES):
            return key
    elif isinstance(key, rsa.RSAPrivateKey):
        if key.key_size >= MIN_RSA_KEY_BITS:
            return key
    elif isinstance(key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey):
        return key
    raise CAError(
        "ca-mismatch",
        f"unsupported CA key {_key_kind(key)}: use ECDSA P-256/P-384/P-521, RSA >= {MIN_RSA_KEY_BITS} bits "
        "or Ed25519/Ed448",
    )


def _key_kind(key: object) -> str:
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return f"ECDSA {key.curve.name}"
    if isinstance(key, rsa.RSAPrivateKey):
        return f"RSA-{key.key_size}"
    return type(key).__name__.removesuffix("PrivateKey").lstrip("_") or "unknown"


def _check_is_ca(cert: x509.Certificate) -> None:
    try:
        basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        raise CAError("ca-not-ca", "the certificate has no BasicConstraints extension (not a CA)") from None
    if not basic.ca:
        raise CAError("ca-not-ca", "the certificate's BasicConstraints say ca=false (not a CA)")
    try:
        usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return
    if not usage.key_cert_sign:
        raise CAError("ca-not-ca", "the certificate's KeyUsage lacks keyCertSign")


def _check_validity(cert: x509.Certificate, now: datetime) -> None:
    not_before, not_after = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now >= not_after:
        raise CAError("ca-expired", f"the CA certificate expired at {not_after.isoformat()}")
    if now < not_before:
        raise CAError("ca-expired", f"the CA certificate is not valid before {not_before.isoformat()}")
    if not_after - now < CA_EXPIRY_WARNING:
        log.warning("interception CA expires soon, at %s", not_after.isoformat())


def _parse_host(host: str) -> tuple[str, x509.GeneralName]:
    """Normalise a host (lowercase, no trailing dot, IPv6 brackets removed) and pick its SAN form."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
        try:
            ip6 = ipaddress.IPv6Address(text)
        except ValueError:
            raise CAError("leaf-host-invalid", f"not an IPv6 literal: {host!r}") from None
        return str(ip6), x509.IPAddress(ip6)
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        pass
    else:
        return str(ip), x509.IPAddress(ip)
    name = text.lower().removesuffix(".")
    if (
        not name
        or len(name) > DNS_NAME_MAX_CHARS
        or not name.isascii()
        or not all(_DNS_LABEL.fullmatch(label) for label in name.split("."))
    ):
        raise CAError("leaf-host-invalid", f"not a host name or IP literal: {host!r}")
    return name, x509.DNSName(name)


def _aki_for_issuer(cert: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    try:
        ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(cert.public_key())  # type: ignore[arg-type]
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


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
        checked = _check_key_type(key, require_p256=require_p256)
        if _spki(checked) != _spki(cert):
            raise CAError("ca-mismatch", "the CA private key does not match the CA certificate")
        _check_is_ca(cert)
        self._cert = cert
        self._key = checked
        self._hash = _signature_hash(checked)
        self._cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        self._thumbprint = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()
        self._aki = _aki_for_issuer(cert)
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
        start = _utcnow(now).replace(microsecond=0)
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
        return self._mint(host, _utcnow(now))[0]

    def _mint(self, host: str, now: datetime) -> tuple[bytes, datetime]:
        """The PEM leaf and its not_after."""
        name, san = _parse_host(host)
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

    def _leaf_key_pem(self) -> bytes:
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


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to a fresh ``mode`` file next to ``path``, then rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask must not loosen or tighten what we asked for
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename durable; best effort
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_key_file(key_path: Path) -> bytes:
    """Read a private key file, refusing one that anybody but its owner can access."""
    try:
        fd = os.open(key_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise CAError("ca-missing", f"CA key file {key_path} does not exist") from None
    except PermissionError:
        raise CAError("ca-key-permissions", f"CA key file {key_path} is not readable by this user") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CAError("ca-malformed", f"CA key file {key_path} is not a regular file")
        if st.st_mode & GROUP_OTHER_BITS:
            raise CAError(
                "ca-key-permissions",
                f"CA key file {key_path} has mode {stat.S_IMODE(st.st_mode):04o}; "
                f"it must be accessible by its owner only (chmod 600)",
            )
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


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
    return _load_pair(Path(cert_path), Path(key_path), leaf_validity, _utcnow(now), require_p256=False)


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


@contextlib.contextmanager
def _dir_lock(data_dir: Path) -> Iterator[None]:
    """An exclusive advisory lock so that two processes never create two CAs in one directory."""
    if sys.platform == "win32":
        yield
        return
    fd = os.open(data_dir / CA_LOCK_FILENAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, KEY_FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


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
    if not data_dir.exists():
        data_dir.mkdir(mode=DATA_DIR_MODE, parents=True, exist_ok=True)
        os.chmod(data_dir, DATA_DIR_MODE)
    elif data_dir.stat().st_mode & 0o022:
        log.warning("data directory %s is writable by group or others", data_dir)
    cert_path, key_path = data_dir / CA_CERT_FILENAME, data_dir / CA_KEY_FILENAME
    with _dir_lock(data_dir):
        have_cert, have_key = cert_path.exists(), key_path.exists()
        if have_cert or have_key:
            if not (have_cert and have_key):
                present, missing = (cert_path, key_path) if have_cert else (key_path, cert_path)
                raise CAError(
                    "ca-missing",
                    f"{present} exists but {missing} does not; restore it, or delete {present} "
                    "to generate a new CA",
                )
            ca = _load_pair(cert_path, key_path, leaf_validity, _utcnow(now), require_p256=True)
            log.info("loaded interception CA %s sha256=%s", cert_path, ca.thumbprint_sha256())
            return ca
        ca = CertificateAuthority.generate(validity_days=validity_days, now=now)
        ca.leaf_validity = leaf_validity
        _write_atomic(key_path, ca._ca_key_pem(), KEY_FILE_MODE)
        _write_atomic(cert_path, ca.cert_pem(), CERT_FILE_MODE)
    log.info(
        "created interception CA %s sha256=%s valid until %s",
        cert_path,
        ca.thumbprint_sha256(),
        ca.not_after.isoformat(),
    )
    return ca


# -- leaf contexts -----------------------------------------------------------------------------


class _PemPaths:
    """Hands PEM bytes to OpenSSL by path: memfd (``/proc/self/fd/N``) or files in a 0700 temp dir."""

    def __init__(self, key_pem: bytes, *, use_memfd: bool | None) -> None:
        self._key_fd: int | None = None
        self._dir: str | None = None
        self._finalizer: Callable[[], object]
        if use_memfd is not False and hasattr(os, "memfd_create"):
            fd = os.memfd_create("signing-proxy-leaf-key", os.MFD_CLOEXEC)
            _write_all(fd, key_pem)
            path = f"/proc/self/fd/{fd}"
            if _readable_as(path, key_pem):
                self._key_fd, self.key_path = fd, path
                self._finalizer = weakref.finalize(self, os.close, fd)
                return
            os.close(fd)
            if use_memfd:
                raise OSError("memfd paths are not readable here (is /proc mounted?)")
        elif use_memfd:
            raise OSError("memfd_create is not available on this platform")
        directory = tempfile.mkdtemp(prefix="signing-proxy-leaf-")  # created 0700
        self._dir = directory
        self._finalizer = weakref.finalize(self, _remove_tree, directory)
        self.key_path = os.path.join(directory, "leaf-key.pem")
        _write_new(self.key_path, key_pem)

    @property
    def kind(self) -> str:
        return "memfd" if self._key_fd is not None else "tempdir"

    @property
    def directory(self) -> str | None:
        return self._dir

    @contextlib.contextmanager
    def temporary(self, data: bytes) -> Iterator[str]:
        """A path holding ``data`` for the duration of the block, gone afterwards."""
        if self._key_fd is not None:
            fd = os.memfd_create("signing-proxy-leaf-chain", os.MFD_CLOEXEC)
            try:
                _write_all(fd, data)
                yield f"/proc/self/fd/{fd}"
            finally:
                os.close(fd)
            return
        assert self._dir is not None
        fd, path = tempfile.mkstemp(suffix=".pem", dir=self._dir)  # created 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            yield path
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def close(self) -> None:
        self._finalizer()


def _remove_tree(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def _readable_as(path: str, expected: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read() == expected
    except OSError:
        return False


def _write_new(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), KEY_FILE_MODE)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


class LeafContextCache:
    """Server-side ``ssl.SSLContext`` per host, minted on demand, kept in a bounded LRU.

    Each context is TLS >= 1.2, ALPN ``http/1.1``, loaded with leaf + CA chain and the CA's shared
    leaf key, and carries ``sni_callback = self.sni_callback``. A cached context is re-minted once
    half its leaf's lifetime has passed. ``hits``, ``misses`` and ``evictions`` count lookups; a
    re-mint counts as a miss. Safe to use from several threads; minting happens outside the lock.
    """

    def __init__(
        self,
        ca: CertificateAuthority,
        max_entries: int = LEAF_CACHE_MAX_ENTRIES,
        *,
        alpn_protocols: Sequence[str] = ("http/1.1",),
        clock: Callable[[], datetime] | None = None,
        use_memfd: bool | None = None,
    ) -> None:
        """``use_memfd``: None picks memfd when it works, else a temp dir; True/False force one."""
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._ca = ca
        self.max_entries = max_entries
        self._alpn = list(alpn_protocols)
        self._clock = clock or (lambda: datetime.now(UTC))
        self._entries: OrderedDict[str, tuple[ssl.SSLContext, datetime]] = OrderedDict()
        self._lock = threading.Lock()
        self._pem = _PemPaths(ca._leaf_key_pem(), use_memfd=use_memfd)
        self._closed = False
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @property
    def storage(self) -> str:
        """How PEM reaches OpenSSL: ``"memfd"`` or ``"tempdir"``."""
        return self._pem.kind

    @property
    def temp_dir(self) -> str | None:
        """The private temp dir holding the leaf key, or None with memfd storage."""
        return self._pem.directory

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, host: object) -> bool:
        if not isinstance(host, str):
            return False
        try:
            key, _ = _parse_host(host)
        except CAError:
            return False
        return key in self._entries

    def get(self, host: str) -> ssl.SSLContext:
        """The server context for ``host`` (a DNS name or IP literal); raises ``CAError``."""
        if self._closed:
            raise RuntimeError("LeafContextCache is closed")
        # Keys are normalised and normalising is idempotent: a host found as-is needs no parsing.
        key = host if host in self._entries else _parse_host(host)[0]
        now = _utcnow(self._clock())
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and now < entry[1]:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry[0]
            self.misses += 1
        context, refresh_at = self._new_context(key, now)
        with self._lock:
            self._entries[key] = (context, refresh_at)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
                self.evictions += 1
        return context

    def new_base_context(self) -> ssl.SSLContext:
        """A server context with no certificate that picks the leaf from SNI alone.

        Handshakes without SNI (clients connecting to an IP literal) fail on it; prefer
        ``get(connect_host)``, which also selects by SNI but falls back to the CONNECT host.
        """
        return self._configured_context()

    def sni_callback(
        self, ssl_object: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext
    ) -> int | None:
        """``SSLContext.sni_callback``: switch the handshake to the leaf for ``server_name``."""
        if server_name is None:
            return None  # keep the context the connection started with
        try:
            leaf_context = self.get(server_name)
        except CAError as exc:
            log.warning("TLS interception refused SNI %r: %s", server_name, exc)
            return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
        except Exception:
            log.exception("TLS interception failed for SNI %r", server_name)
            return ssl.ALERT_DESCRIPTION_INTERNAL_ERROR
        if leaf_context is not context:
            ssl_object.context = leaf_context
        return None

    def close(self) -> None:
        """Forget every context and remove the leaf key's temp files (or memfd)."""
        self._closed = True
        with self._lock:
            self._entries.clear()
        self._pem.close()

    def __enter__(self) -> LeafContextCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _configured_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.options |= ssl.OP_NO_RENEGOTIATION
        context.set_alpn_protocols(self._alpn)
        context.sni_callback = self.sni_callback
        return context

    def _new_context(self, host: str, now: datetime) -> tuple[ssl.SSLContext, datetime]:
        leaf_pem, not_after = self._ca._mint(host, now)
        context = self._configured_context()
        with self._pem.temporary(leaf_pem + self._ca.cert_pem()) as chain_path:
            context.load_cert_chain(chain_path, self._pem.key_path)
        return context, now + (not_after - now) / 2


# -- CA bundle ---------------------------------------------------------------------------------


def _system_bundle_candidates() -> Iterator[Path]:
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate:
            yield Path(candidate)
    try:
        import certifi
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
    _write_atomic(out_path, system + ours, CERT_FILE_MODE)
    return out_path
