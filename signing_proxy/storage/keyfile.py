"""Private key files on disk: owner-only, refused loudly when they are not.

A key that others can read is a key that others may have: the proxy refuses to start with a key
file that is group- or world-readable, rather than signing with it.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..core.errors import KeyFormatError
from ..core.jwk import PRIVATE_JWK_MEMBERS, PublicKey, SigningKey, load_private_key, public_key_from_jwk
from ..errors import KeyFileError
from .files import PrivateFileError, make_private_dir, read_private, write_atomic

__all__ = ["KeyFileError", "load_key_file", "load_public_key_file", "write_private_file"]


def write_private_file(path: Path, data: bytes, *, overwrite: bool = False) -> None:
    """Write ``data`` readable by the owner only (0600), atomically; never widen an existing file."""
    make_private_dir(path.parent)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; refusing to overwrite a key")
    write_atomic(path, data)


def load_key_file(path: Path) -> SigningKey:
    """Load a PEM (PKCS#8) or private-JWK key file that only its owner can read."""
    try:
        data = read_private(path)
    except PrivateFileError as exc:
        raise _key_file_error(exc) from exc
    try:
        return load_private_key(data)
    except KeyFormatError as exc:
        raise KeyFileError(exc.reason, path, f"not a usable Ed25519 private key ({exc.detail})") from exc


def load_public_key_file(path: Path) -> PublicKey:
    """A public Ed25519 key from a file: SPKI PEM, a public JWK, or a private key file (PKCS#8 PEM
    or private JWK, owner-only as ``load_key_file`` wants it) whose public half is taken, so the
    file an agent signs with can be pinned as it is. KeyFileError names the path and the reason."""
    try:
        data = path.read_bytes().strip()
    except OSError as exc:
        raise KeyFileError("key-unreadable", path, f"cannot read key file: {exc.strerror or exc}") from None
    try:
        if data.startswith(b"{"):
            jwk = json.loads(data)
            if isinstance(jwk, dict) and PRIVATE_JWK_MEMBERS.intersection(jwk):
                return load_key_file(path).public
            return public_key_from_jwk(jwk)
        if b"PRIVATE KEY-----" in data:
            return load_key_file(path).public
        return PublicKey.from_pem(data)
    except KeyFormatError as exc:
        raise KeyFileError(exc.reason, path, f"not a usable Ed25519 public key ({exc.detail})") from None
    except ValueError:
        raise KeyFileError("malformed-jwk", path, "not valid JSON") from None


def _key_file_error(exc: PrivateFileError) -> KeyFileError:
    path = exc.path
    if exc.reason == "missing":
        return KeyFileError("key-missing", path, "key file does not exist")
    if exc.reason == "wrong-kind":
        return KeyFileError("key-unreadable", path, "key path is not a regular file")
    if exc.reason == "too-open":
        return KeyFileError(
            "key-permissions",
            path,
            f"key file mode is {exc.mode:04o}; it must be readable by its owner only (run: chmod 600 {path})",
        )
    operation = "read" if exc.reason == "denied" else exc.operation
    return KeyFileError("key-unreadable", path, f"cannot {operation} key file: {exc.detail}")
