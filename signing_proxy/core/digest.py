"""Content-Digest (RFC 9530): compute, parse, check in constant time.

The digest covers the message content as sent: after removing transfer coding, with any content
coding kept. An empty body has a digest too (RFC 9530 appendix B.2): the spec demands
``Content-Digest`` on every request.
"""

from __future__ import annotations

import hashlib
import hmac

from .b64 import b64_encode
from .errors import FieldError, VerificationError
from .sfv import parse_dictionary

__all__ = ["EMPTY_SHA256", "content_digest", "parse_content_digest", "verify_content_digest"]

# Algorithms of the RFC 9530 registry marked "Active"; the deprecated ones are never trusted.
_ACTIVE = {"sha-256": hashlib.sha256, "sha-512": hashlib.sha512}

EMPTY_SHA256 = "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:"


def content_digest(body: bytes) -> str:
    """``sha-256=:<base64>:`` for the exact body bytes (the form the spec requires)."""
    if not body:
        return EMPTY_SHA256
    return "sha-256=:" + b64_encode(hashlib.sha256(body).digest()) + ":"


def parse_content_digest(value: str) -> dict[str, bytes]:
    """Parse the Dictionary into algorithm -> digest bytes; every member must be a Byte Sequence, and
    an algorithm named twice (in one line or across lines) is refused, never "last wins"."""

    def refuse_duplicate(alg: str, where: str) -> None:
        if where == "dictionary":  # a repeated parameter name inside a member is not an algorithm
            raise FieldError("duplicate-content-digest", f"Content-Digest names {alg!r} more than once")

    try:
        parsed = parse_dictionary(value, refuse_duplicate)
    except FieldError:
        raise
    except (ValueError, UnicodeEncodeError) as exc:
        raise FieldError("malformed-content-digest", "Content-Digest is not a structured Dictionary") from exc
    out: dict[str, bytes] = {}
    for alg, (digest, _params) in parsed.items():
        if not isinstance(digest, bytes):
            raise FieldError("malformed-content-digest", f"member {alg!r} is not a Byte Sequence")
        out[alg] = digest
    return out


def verify_content_digest(value: str | None, body: bytes) -> None:
    """Refuse unless Content-Digest has a ``sha-256`` member and every active member matches the body."""
    if value is None:
        raise VerificationError("missing-content-digest", "Content-Digest header is absent")
    try:
        members = parse_content_digest(value)
    except FieldError as exc:
        raise VerificationError(exc.reason, exc.detail) from exc
    if "sha-256" not in members:
        raise VerificationError("content-digest-unsupported", "Content-Digest has no sha-256 member")
    for alg, expected in members.items():
        hasher = _ACTIVE.get(alg)
        if hasher is None:
            continue  # unknown or deprecated algorithm: ignored, never trusted (RFC 9530 section 6.4)
        if not hmac.compare_digest(hasher(body).digest(), expected):
            raise VerificationError("content-digest-mismatch", f"{alg} digest does not match the body")
