"""X.509 building blocks of the interception CA: issuer key checks, signature digests, and host names
as leaf certificates name them (``normalize_host``). Refusals are ``CAError`` with a stable reason."""

from __future__ import annotations

import ipaddress
import re
from datetime import UTC, datetime
from typing import Final, TypeAlias

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

from ..errors import CAError

__all__ = [
    "DNS_NAME_MAX_CHARS",
    "MIN_RSA_KEY_BITS",
    "IssuerKey",
    "aki_for_issuer",
    "as_utc",
    "check_is_ca",
    "check_key_type",
    "normalize_host",
    "parse_host",
    "signature_hash",
    "spki",
]

MIN_RSA_KEY_BITS: Final = 2048
DNS_NAME_MAX_CHARS: Final = 253  # RFC 1035 2.3.4 (255 octets on the wire, less the length bytes)

_DNS_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_SUPPORTED_CURVES: Final = (ec.SECP256R1, ec.SECP384R1, ec.SECP521R1)

IssuerKey: TypeAlias = (
    ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey
)
_Hash: TypeAlias = hashes.SHA256 | hashes.SHA384 | hashes.SHA512


def as_utc(now: datetime | None) -> datetime:
    """``now`` in UTC (the current time when None); a naive datetime is refused with ValueError."""
    if now is None:
        return datetime.now(UTC)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now.astimezone(UTC)


def signature_hash(key: IssuerKey) -> _Hash | None:
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


def spki(key: x509.Certificate | IssuerKey) -> bytes:
    """The DER SubjectPublicKeyInfo of a certificate or key (to match the two)."""
    public = key.public_key()
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def check_key_type(key: object, *, require_p256: bool) -> IssuerKey:
    """``key`` when it can issue: P-256 only for a generated CA; else ECDSA P-256/384/521, RSA, EdDSA."""
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


def check_is_ca(cert: x509.Certificate) -> None:
    """Refuse a certificate whose BasicConstraints (or KeyUsage) do not make it a CA (``ca-not-ca``)."""
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


def parse_host(host: str) -> tuple[str, x509.GeneralName]:
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


def normalize_host(host: str) -> str:
    """The host as leaves name it (lowercase, no trailing dot, IPv6 unbracketed); ``leaf-host-invalid``."""
    return parse_host(host)[0]


def aki_for_issuer(cert: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    """The AuthorityKeyIdentifier that leaves issued by ``cert`` carry."""
    try:
        ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(cert.public_key())  # type: ignore[arg-type]
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
