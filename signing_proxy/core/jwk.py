"""Ed25519 keys as PEM (PKCS#8 / SPKI) and as JWK (RFC 8037), named by RFC 7638 thumbprint.

A key is always named by its thumbprint: it is the RFC 9421 ``keyid``, the delegation ``cnf.jkt``
and the ``agent_identity_hash`` of the spec. The thumbprint input holds only ``crv``, ``kty`` and
``x`` in lexicographic order with no whitespace (RFC 7638 section 3, RFC 8037 appendix A.3).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from . import ed25519
from .b64 import b64url_decode, b64url_encode
from .errors import KeyFormatError
from .json_bounds import loads_strict

__all__ = [
    "PRIVATE_JWK_MEMBERS",
    "PublicKey",
    "SigningKey",
    "jwk_thumbprint",
    "load_private_key",
    "public_key_from_jwk",
    "thumbprint_of_raw",
]

# RFC 7517/7518: members that only private keys carry; never published, never accepted as public.
PRIVATE_JWK_MEMBERS = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})


def thumbprint_of_raw(raw_public: bytes) -> str:
    """RFC 7638 SHA-256 thumbprint of an Ed25519 public key given as its 32 raw bytes."""
    canonical = '{"crv":"Ed25519","kty":"OKP","x":"' + b64url_encode(raw_public) + '"}'
    return b64url_encode(hashlib.sha256(canonical.encode("ascii")).digest())


def jwk_thumbprint(jwk: Mapping[str, Any]) -> str:
    """RFC 7638 thumbprint of any JWK (only the members required for its ``kty`` are hashed)."""
    kty = jwk.get("kty")
    required = {"OKP": ("crv", "kty", "x"), "EC": ("crv", "kty", "x", "y"), "RSA": ("e", "kty", "n")}
    if kty not in required:
        raise KeyFormatError("unsupported-key-type", f"kty {kty!r} has no thumbprint rule here")
    members = {}
    for name in required[kty]:
        value = jwk.get(name)
        if not isinstance(value, str):
            raise KeyFormatError("malformed-jwk", f"member {name!r} missing or not a string")
        members[name] = value
    canonical = json.dumps(members, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return b64url_encode(hashlib.sha256(canonical.encode("utf-8")).digest())


def _decode_32(value: object, member: str) -> bytes:
    if not isinstance(value, str):
        raise KeyFormatError("malformed-jwk", f"member {member!r} missing or not a string")
    try:
        raw = b64url_decode(value)
    except ValueError as exc:
        raise KeyFormatError("malformed-jwk", f"member {member!r} is not canonical base64url") from exc
    if len(raw) != 32:
        raise KeyFormatError("malformed-jwk", f"member {member!r} must decode to 32 bytes")
    return raw


def _check_okp(jwk: Mapping[str, Any]) -> None:
    if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
        raise KeyFormatError("unsupported-key-type", "only OKP/Ed25519 keys are supported")


@dataclass(frozen=True)
class PublicKey:
    """An Ed25519 public key with its thumbprint computed once."""

    key: Ed25519PublicKey = field(repr=False, compare=False)
    raw: bytes
    thumbprint: str

    @classmethod
    def from_raw(cls, raw: bytes) -> PublicKey:
        if len(raw) != 32:
            raise KeyFormatError("malformed-key", "an Ed25519 public key is 32 bytes")
        return cls(Ed25519PublicKey.from_public_bytes(raw), raw, thumbprint_of_raw(raw))

    @classmethod
    def from_pem(cls, pem: bytes) -> PublicKey:
        try:
            key = serialization.load_pem_public_key(pem)
        except ValueError as exc:
            raise KeyFormatError("malformed-key", "not a PEM public key") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise KeyFormatError("unsupported-key-type", "only Ed25519 keys are supported")
        return cls.from_raw(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))

    def jwk(self) -> dict[str, str]:
        """The public JWK: exactly ``kty``, ``crv``, ``x``."""
        return {"kty": "OKP", "crv": "Ed25519", "x": b64url_encode(self.raw)}

    def verify(self, signature: bytes, data: bytes) -> bool:
        """Whether ``signature`` is valid for ``data``: exactly OpenSSL's verdict (core.ed25519)."""
        return ed25519.verify(self.key, self.raw, signature, data)


def public_key_from_jwk(jwk: Mapping[str, Any]) -> PublicKey:
    """Load a *public* OKP/Ed25519 JWK. A JWK carrying private members is refused."""
    if not isinstance(jwk, Mapping):
        raise KeyFormatError("malformed-jwk", "a JWK is a JSON object")
    _check_okp(jwk)
    leaked = PRIVATE_JWK_MEMBERS.intersection(jwk)
    if leaked:
        raise KeyFormatError("private-member-in-public-jwk", f"members {sorted(leaked)} must not appear")
    return PublicKey.from_raw(_decode_32(jwk.get("x"), "x"))


class SigningKey:
    """An Ed25519 private key; the public half, its JWK and thumbprint are computed once."""

    __slots__ = ("_private", "_secret", "public")
    blocking: ClassVar[bool] = False  # True: ``sign`` waits on a device (a token key), never on the loop

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        seed = private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        self._secret = ed25519.secret_from_seed(seed)  # libsodium's form, for the hot path
        raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public = PublicKey(private.public_key(), raw, thumbprint_of_raw(raw))

    def __repr__(self) -> str:  # never print private material
        return f"SigningKey(thumbprint={self.thumbprint!r})"

    @property
    def thumbprint(self) -> str:
        return self.public.thumbprint

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> SigningKey:
        if len(seed) != 32:
            raise KeyFormatError("malformed-key", "an Ed25519 private seed is 32 bytes")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def from_pem(cls, pem: bytes) -> SigningKey:
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as exc:
            raise KeyFormatError("malformed-key", "not an unencrypted PKCS#8 PEM private key") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFormatError("unsupported-key-type", "only Ed25519 keys are supported")
        return cls(key)

    @classmethod
    def from_jwk(cls, jwk: Mapping[str, Any]) -> SigningKey:
        """Load a private OKP/Ed25519 JWK (``d`` required); ``x``, when present, must match ``d``."""
        if not isinstance(jwk, Mapping):
            raise KeyFormatError("malformed-jwk", "a JWK is a JSON object")
        _check_okp(jwk)
        key = cls.from_seed(_decode_32(jwk.get("d"), "d"))
        if "x" in jwk and _decode_32(jwk["x"], "x") != key.public.raw:
            raise KeyFormatError("malformed-jwk", "member 'x' does not belong to member 'd'")
        return key

    def to_pem(self) -> bytes:
        return self._private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def to_jwk(self) -> dict[str, str]:
        """The private JWK (``kty``, ``crv``, ``x``, ``d``). Handle with care."""
        seed = self._private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        return {**self.public.jwk(), "d": b64url_encode(seed)}

    def sign(self, data: bytes) -> bytes:
        return ed25519.sign(self._secret, data)


def load_private_key(data: bytes) -> SigningKey:
    """Load a private key from file contents: PKCS#8 PEM or a private JWK (strict JSON:
    ``json_bounds.loads_strict``, a member given twice or nesting too deep is malformed too)."""
    stripped = data.strip()
    if stripped.startswith(b"{"):
        try:
            jwk = loads_strict(stripped)
        except ValueError as exc:
            raise KeyFormatError("malformed-jwk", f"not valid JSON: {exc}") from None
        return SigningKey.from_jwk(jwk)
    if stripped.startswith(b"-----BEGIN"):
        return SigningKey.from_pem(stripped)
    raise KeyFormatError("malformed-key", "expected a PKCS#8 PEM or a private JWK")
