"""Private key files on disk: owner-only, refused loudly when they are not.

A key that others can read is a key that others may have: the proxy refuses to start with a key
file that is group- or world-readable, rather than signing with it.
"""

from __future__ import annotations

from pathlib import Path

from ..core.errors import KeyFormatError
from ..core.jwk import SigningKey, load_private_key
from ..errors import KeyFileError
from .files import PrivateFileError, make_private_dir, read_private, write_atomic

__all__ = ["KeyFileError", "load_key_file", "write_private_file"]


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
