"""The protocol's errors: one small tree, each error carrying a stable machine-readable reason.

    Error                         root of the package's one tree (``signing_proxy.errors`` draws it whole)
     +-- ProtocolError            reason: str (kebab-case, stable, goes on the wire), detail: str
          +-- FieldError          a header field that cannot be parsed or is not allowed
          +-- KeyFormatError      a key (PEM, JWK, directory entry) that is malformed or not Ed25519
          +-- SigningError        we could not sign (covered value absent or not ASCII, bad key window)
          +-- VerificationError   a signature stack refused by a rule of the spec ("Request signature")
          +-- DelegationError     a delegation chain refused; denial = DENIAL_REASON_DELEGATION_INVALID
          +-- ManifestError       a svc.json manifest refused ("Versioning", "Manifest")

The reason is decided where the error is raised and never rewritten on the way out: the proxy
puts it verbatim in the ``reason`` member of its problem+json bodies and in metrics labels. The
detail is for humans and never contains secrets (keys, bearer tokens, credentials).
"""

from __future__ import annotations

__all__ = [
    "DelegationError",
    "Error",
    "FieldError",
    "KeyFormatError",
    "ManifestError",
    "ProtocolError",
    "SigningError",
    "VerificationError",
]


class Error(Exception):
    """The package's root error: ``reason`` is a stable code, ``detail`` a human sentence."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class ProtocolError(Error):
    """A rule of the protocol refused a value (sans-IO: raised by ``core`` only)."""


class FieldError(ProtocolError):
    """A header field is malformed, duplicated where it must not be, or otherwise unusable."""


class KeyFormatError(ProtocolError):
    """A key is malformed, of the wrong type, or carries members it must not."""


class SigningError(ProtocolError):
    """The request cannot be signed; the proxy must not forward it."""


class VerificationError(ProtocolError):
    """A signature (or the stack it belongs to) is refused."""

    def __init__(self, reason: str, detail: str = "", label: str | None = None) -> None:
        super().__init__(reason, detail)
        self.label = label


class DelegationError(ProtocolError):
    """A delegation chain is refused; every refusal maps to one denial reason."""

    denial_reason = "DENIAL_REASON_DELEGATION_INVALID"


class ManifestError(ProtocolError):
    """A manifest is refused."""
