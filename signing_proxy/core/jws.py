"""Compact JWS with EdDSA (RFC 7515, RFC 8037) and the JWT profile that delegation chains use.

Delegation tokens are compact JWSs signed with Ed25519, so this module implements exactly that
and nothing more: one algorithm (``EdDSA``, never ``none``), the compact serialization only, and
strict parsing. Every part must be unpadded, canonical base64url, the header a JSON object with
unique member names, and any ``crit`` header refused because we implement no JWS extensions
(RFC 7515 section 4.1.11). Being strict here means two spellings of one token never both pass and
a header we cannot honour never gets ignored. The JWT layer (RFC 7519) adds ``typ`` = ``JWT`` and a
JSON-object payload on top; the plain JWS layer stays usable for RFC 8037 appendix A.4/A.5, whose
payload is not JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .b64 import b64url_decode, b64url_encode
from .errors import DelegationError
from .json_bounds import finite_float, no_constant, refuse_lone_surrogates, unique_members
from .jwk import PublicKey, SigningKey

__all__ = [
    "ALG",
    "ED25519_SIGNATURE_BYTES",
    "JWT_TYP",
    "MAX_JWS_CHARS",
    "UNDERSTOOD_CRIT",
    "ParsedJws",
    "ParsedJwt",
    "parse_jws",
    "parse_jwt",
    "sign_jws",
    "sign_jwt",
    "unique_members",
    "verify_jws",
]

ALG = "EdDSA"  # spec "Delegation token claims": header alg = EdDSA; RFC 8037 section 3.1
JWT_TYP = "JWT"  # spec "Delegation token claims": header typ = JWT; RFC 7519 section 5.1
ED25519_SIGNATURE_BYTES = 64  # RFC 8032 section 5.1.6: R || S
# Our bound (spec "Limits": body sizes not shown). A link with a jwk header is about 600 chars;
# the bound keeps a hostile token from costing more than a few base64 decodes.
MAX_JWS_CHARS = 16_384
# RFC 7515 section 4.1.11: names a recipient understands in "crit". We implement no extension.
UNDERSTOOD_CRIT: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ParsedJws:
    """A compact JWS split and decoded; nothing about it is trusted until verify_jws passes."""

    header: dict[str, Any]
    payload: bytes
    signature: bytes
    signing_input: bytes
    parts: tuple[str, str, str]


@dataclass(frozen=True)
class ParsedJwt:
    """A JWS whose header says ``typ: JWT`` and whose payload is a JSON object (the claims)."""

    jws: ParsedJws
    claims: dict[str, Any]

    @property
    def header(self) -> dict[str, Any]:
        """The protected header of the underlying JWS."""
        return self.jws.header


def _malformed(detail: str) -> DelegationError:
    return DelegationError("malformed-token", detail)


def _loads_strict(data: bytes, what: str) -> Any:
    """Strict UTF-8 JSON: unique member names, finite numbers only, no BOM, no unpaired surrogate
    (an escape ``\\ud800`` alone: RFC 7493 section 2.1; such a string cannot be written as UTF-8)."""
    try:
        text = data.decode("utf-8")
        value = json.loads(
            text, object_pairs_hook=unique_members, parse_float=finite_float, parse_constant=no_constant
        )
        refuse_lone_surrogates(text, value)
    except (UnicodeError, ValueError, RecursionError) as exc:
        raise _malformed(f"{what} is not strict UTF-8 JSON") from exc
    return value


def _decode_part(part: str, what: str) -> bytes:
    try:
        return b64url_decode(part)
    except ValueError as exc:
        raise _malformed(f"{what} is not canonical unpadded base64url") from exc


def _check_header(header: Mapping[str, Any]) -> None:
    """Refuse any header we could not honour: another alg, crit extensions, unencoded payloads."""
    alg = header.get("alg")
    if alg != ALG:
        # Compared as a string so "none", "HS256" (key confusion) and RFC 9864 "Ed25519" all fail.
        shown = repr(alg[:32]) if isinstance(alg, str) else type(alg).__name__
        raise DelegationError("unsupported-algorithm", f"alg must be {ALG!r}, got {shown}")
    if "crit" in header:
        crit = header["crit"]
        if not isinstance(crit, list) or not crit or not all(isinstance(n, str) for n in crit):
            raise _malformed("crit must be a non-empty array of strings (RFC 7515 section 4.1.11)")
        unknown = [n for n in crit if n not in UNDERSTOOD_CRIT]
        if unknown:
            raise DelegationError(
                "unsupported-critical-header", f"critical header parameters not understood: {unknown[:8]}"
            )
    if "b64" in header:
        # RFC 7797 b64=false changes the signing input; we only implement the RFC 7515 one.
        raise DelegationError("unsupported-critical-header", "the RFC 7797 b64 header is not supported")


def sign_jws(header: dict[str, Any], payload: bytes, key: SigningKey) -> str:
    """Compact JWS over ``payload``; the header is serialized compactly in its insertion order."""
    try:
        _check_header(header)
    except DelegationError as exc:
        raise ValueError(exc.detail) from exc
    header_json = json.dumps(header, separators=(",", ":"), allow_nan=False)
    signing_input = b64url_encode(header_json.encode("utf-8")) + "." + b64url_encode(payload)
    signature = key.sign(signing_input.encode("ascii"))
    return signing_input + "." + b64url_encode(signature)


def parse_jws(token: str) -> ParsedJws:
    """Split and decode a compact JWS, refusing anything non-canonical or not EdDSA."""
    if not isinstance(token, str) or not token.isascii():
        raise _malformed("a compact JWS is an ASCII string")
    if len(token) > MAX_JWS_CHARS:
        raise _malformed(f"a compact JWS is at most {MAX_JWS_CHARS} characters here")
    parts = token.split(".")
    if len(parts) != 3:
        raise _malformed(f"a compact JWS has exactly 3 parts, got {len(parts)}")
    header_b64, payload_b64, signature_b64 = parts
    header = _loads_strict(_decode_part(header_b64, "header"), "header")
    if not isinstance(header, dict):
        raise _malformed("the JWS header is not a JSON object")
    # The header is judged before the rest so that an unsecured alg=none token fails as such.
    _check_header(header)
    if not payload_b64 or not signature_b64:
        # An empty payload would be RFC 7515 appendix F detached content, which we do not use.
        raise _malformed("a compact JWS part is empty")
    payload = _decode_part(payload_b64, "payload")
    signature = _decode_part(signature_b64, "signature")
    if len(signature) != ED25519_SIGNATURE_BYTES:
        raise _malformed(f"an Ed25519 signature is {ED25519_SIGNATURE_BYTES} bytes")
    return ParsedJws(
        header=header,
        payload=payload,
        signature=signature,
        signing_input=f"{header_b64}.{payload_b64}".encode("ascii"),
        parts=(header_b64, payload_b64, signature_b64),
    )


def verify_jws(parsed: ParsedJws, public_key: PublicKey) -> None:
    """Raise DelegationError ``bad-signature`` unless ``public_key`` signed ``parsed``."""
    if not public_key.verify(parsed.signature, parsed.signing_input):
        raise DelegationError("bad-signature", f"signature does not verify under key {public_key.thumbprint}")


def sign_jwt(
    claims: Mapping[str, Any], key: SigningKey, extra_header: Mapping[str, Any] | None = None
) -> str:
    """Compact JWT with header ``{"alg":"EdDSA","typ":"JWT", ...extra_header}``."""
    header: dict[str, Any] = {"alg": ALG, "typ": JWT_TYP}
    if extra_header:
        clash = sorted({"alg", "typ"}.intersection(extra_header))
        if clash:
            raise ValueError(f"extra_header must not set {clash}")
        header.update(extra_header)
    payload = json.dumps(dict(claims), separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return sign_jws(header, payload.encode("utf-8"), key)


def parse_jwt(token: str) -> ParsedJwt:
    """Parse a JWT: a strict JWS whose ``typ`` is exactly ``JWT`` and whose payload is a JSON object."""
    jws = parse_jws(token)
    # The spec fixes typ = JWT; a case variant or another media type is a different token kind.
    if jws.header.get("typ") != JWT_TYP:
        raise _malformed(f"a JWT header carries typ {JWT_TYP!r}")
    claims = _loads_strict(jws.payload, "JWT claims")
    if not isinstance(claims, dict):
        raise _malformed("JWT claims are a JSON object")
    return ParsedJwt(jws=jws, claims=claims)
