"""The package's one error tree, and the one map from errors to HTTP statuses.

    Error                          (core.errors) reason: stable kebab-case code; detail: a sentence
     +-- ProtocolError             (core.errors) a rule of the protocol refused a value
     |    +-- FieldError           400  a header field that cannot be parsed or is not allowed
     |    +-- KeyFormatError       400  a key or directory entry that is malformed or not Ed25519
     |    +-- SigningError         500  we could not sign: never forwarded unsigned (fail closed)
     |    +-- VerificationError    401  a signature stack refused by a rule of the spec (503 for
     |                                   ``verifier-busy``: no fetch budget left for a new directory)
     |    +-- DelegationError      403  a delegation chain refused
     |    +-- ManifestError        502  a publisher's manifest refused
     +-- ConfigError               the configuration refused; the message starts with the key path
     +-- StorageError              on-disk state refused (names the path)
     |    +-- KeyFileError         a key file: missing, unreadable, too open, malformed
     |    +-- KeyStoreError        the key store: missing, malformed, too open, or a change would break it
     |    +-- TokenError           a PKCS#11 token or its key: missing, PIN refused, unavailable
     |    +-- CAError              the interception CA, or a leaf it cannot mint
     +-- DirectoryError            502  a directory or revocation list could not be fetched or used
     +-- EgressError               403  a fetch on a remote party's word refused by the egress policy
     +-- ProxyError                an answer with its own status (and extra response fields)
     +-- CliError                  the operator's input to a command: one line, exit status 2

Every class keeps ``reason`` and ``detail``. The status a refusal is answered with is decided in
one place, :func:`http_status`; callers that answer with another status say so explicitly.
``detail`` never carries a secret (key, PIN, bearer token, proxy credential).
"""

from __future__ import annotations

import json
from http import HTTPStatus
from pathlib import Path

from .core.errors import (
    DelegationError,
    Error,
    FieldError,
    KeyFormatError,
    ManifestError,
    ProtocolError,
    SigningError,
    VerificationError,
)
from .core.pkcs11_uri import mask_pin_value
from .core.uri import MISDIRECTED

__all__ = [
    "VERIFIER_BUSY",
    "CAError",
    "CliError",
    "ConfigError",
    "DelegationError",
    "DirectoryError",
    "EgressError",
    "Error",
    "FieldError",
    "KeyFileError",
    "KeyFormatError",
    "KeyStoreError",
    "ManifestError",
    "ProtocolError",
    "ProxyError",
    "SigningError",
    "StorageError",
    "TokenError",
    "VerificationError",
    "http_status",
    "problem_body",
]

PROBLEM_TYPE_BASE = "https://signing-proxy.dev/problems/"  # documentation anchors, one per reason


class ConfigError(Error, ValueError):
    """A configuration value is wrong, or what it names is unusable; the message starts with its key path."""

    def __init__(self, message: str, *, reason: str = "config-invalid") -> None:
        super().__init__(reason, message)

    def __str__(self) -> str:
        return self.detail


class StorageError(Error):
    """On-disk state that cannot be used; ``path`` names the file or folder, ``str()`` leads with it."""

    def __init__(self, reason: str, path: Path | None, detail: str) -> None:
        super().__init__(reason, detail)
        self.path = path

    def __str__(self) -> str:
        return f"{self.path}: {self.detail}" if self.path is not None else self.detail


class KeyFileError(StorageError):
    """A key file is missing, unreadable, too open, or malformed; ``str()`` says which and where."""

    def shown(self) -> str:
        """``str()`` with the path's ``pin-value`` masked: a mistyped ``pkcs11:`` URI (``pkcs11;...``)
        is taken for a key path, and a refusal quoting it would show the PIN."""
        return f"{mask_pin_value(str(self.path))}: {self.detail}" if self.path is not None else self.detail


class KeyStoreError(StorageError):
    """The store is missing, malformed, too open, or a change would break it; names the path."""


class TokenError(StorageError):
    """A PKCS#11 token or its key cannot be used (never names the PIN); ``reason`` is stable:
    ``token-module-unloadable``, ``token-missing``, ``token-pin-incorrect``, ``token-pin-missing``,
    ``token-key-missing``, ``token-key-exists``, ``token-key-unsupported``, ``token-key-mismatch``,
    ``token-unavailable``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, None, detail)


class CAError(StorageError):
    """A CA refused or a leaf that cannot be minted: ``reason`` is a stable kebab-case code.

    Reasons: ``ca-missing``, ``ca-key-permissions``, ``ca-malformed``, ``ca-mismatch``, ``ca-not-ca``,
    ``ca-expired``, ``leaf-host-invalid``. ``detail`` is a sentence for the operator.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason, None, detail)

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


class DirectoryError(Error):
    """A directory (or revocation list) could not be fetched or parsed; ``reason`` is stable."""


class EgressError(Error):
    """A URL named by a remote party that the egress policy (``net.egress``) refuses to fetch.

    Reasons: ``egress-scheme``, ``egress-userinfo``, ``egress-query``, ``egress-fragment``, ``egress-host``,
    ``egress-url`` (too long, or characters not allowed on the wire), ``egress-address`` (a forbidden
    address), ``egress-unresolvable``. ``detail`` names the rule, never the resolved addresses.
    """


class ProxyError(Error):
    """An error the proxy answers itself, instead of forwarding: status, reason, detail, extra fields."""

    def __init__(self, status: int, reason: str, detail: str = "", headers: tuple[tuple[str, str], ...] = ()):
        super().__init__(reason, detail)
        self.status = status
        self.headers = headers

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.detail}"

    @classmethod
    def of(cls, error: Error, *, status: int | None = None, detail: str | None = None) -> ProxyError:
        """The answer for ``error``: its reason kept, the status from :func:`http_status` unless given."""
        return cls(
            http_status(error) if status is None else status,
            error.reason,
            error.detail if detail is None else detail,
        )


class CliError(Error):
    """Bad input from the operator: printed as one line, exit status 2."""

    def __init__(self, message: str) -> None:
        super().__init__("usage", message)

    def __str__(self) -> str:
        return self.detail


# The one map from an error's kind to the status a refusal answers with (most specific class first).
# A verification or a directory fetch refused because the verifier may not fetch more new key
# directories this second (verify.fetches_per_s): answered 503 with Retry-After, whatever its class
VERIFIER_BUSY = "verifier-busy"

_STATUS: tuple[tuple[type[Error], int], ...] = (
    (FieldError, 400),
    (KeyFormatError, 400),
    (SigningError, 500),
    (VerificationError, 401),
    (DelegationError, 403),
    (ManifestError, 502),
    (DirectoryError, 502),
    (EgressError, 403),
    (ConfigError, 500),
    (StorageError, 500),
    (CliError, 400),
)


def http_status(error: Error) -> int:
    """The HTTP status that answers ``error`` (a ``ProxyError`` carries its own)."""
    if isinstance(error, ProxyError):
        return error.status
    if error.reason == VERIFIER_BUSY:  # capacity, not a verdict: the client may retry
        return 503
    if error.reason == MISDIRECTED:
        return 421
    for kind, status in _STATUS:
        if isinstance(error, kind):
            return status
    return 500


def problem_body(status: int, reason: str, detail: str = "", **extra: object) -> bytes:
    """A problem+json document (RFC 9457); ``reason`` is the stable machine code."""
    doc: dict[str, object] = {
        "type": PROBLEM_TYPE_BASE + reason,
        "title": HTTPStatus(status).phrase,
        "status": status,
        "reason": reason,
    }
    if detail:
        doc["detail"] = detail
    doc.update(extra)
    return json.dumps(doc, separators=(",", ":")).encode()
