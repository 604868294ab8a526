"""Base64 helpers: strict decoding, because two spellings of the same bytes must never both pass."""

from __future__ import annotations

import base64
import binascii

__all__ = ["b64_decode", "b64_encode", "b64url_decode", "b64url_encode"]


def b64url_encode(data: bytes) -> str:
    """base64url without padding (RFC 7515 section 2)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Strict base64url without padding; raises ValueError on anything non-canonical."""
    if not text.isascii() or "=" in text:
        raise ValueError("base64url must be unpadded ASCII")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError("invalid base64url") from exc
    if b64url_encode(data) != text:
        raise ValueError("non-canonical base64url")
    return data


def b64_encode(data: bytes) -> str:
    """Standard base64 with padding (RFC 8941 Byte Sequence content)."""
    return binascii.b2a_base64(data, newline=False).decode("ascii")  # b64encode, one call less


def b64_decode(text: str) -> bytes:
    """Strict standard base64 with padding."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("invalid base64") from exc
