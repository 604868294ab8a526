"""Key files on disk: private ones owner-only, refused loudly when they are not; every one bounded.

A key that others can read is a key that others may have: the proxy refuses to start with a key
file that is group- or world-readable, rather than signing with it. Public key files and JWK Sets
are read by ``read_public_file``: a regular file of at most ``MAX_KEY_FILE_BYTES`` (never a device,
a FIFO or a folder, which could hang the reader or fill its memory).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from ..core.errors import KeyFormatError
from ..core.json_bounds import loads_strict
from ..core.jwk import PRIVATE_JWK_MEMBERS, PublicKey, SigningKey, load_private_key, public_key_from_jwk
from ..core.keys import MAX_DIRECTORY_BYTES
from ..errors import KeyFileError
from .files import PrivateFileError, make_private_dir, read_private, write_atomic

__all__ = [
    "MAX_KEY_FILE_BYTES",
    "KeyFileError",
    "load_key_file",
    "load_public_key_file",
    "read_public_file",
    "write_private_file",
]

# Our choice, as for a served directory: a key file is a few hundred bytes, a JWK Set of 64 keys fits.
MAX_KEY_FILE_BYTES: Final = MAX_DIRECTORY_BYTES
_OPEN_FLAGS: Final = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


def write_private_file(path: Path, data: bytes, *, overwrite: bool = False) -> None:
    """Write ``data`` readable by the owner only (0600), atomically; never widen an existing file."""
    make_private_dir(path.parent)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; refusing to overwrite a key")
    write_atomic(path, data)


def load_key_file(path: Path) -> SigningKey:
    """Load a PEM (PKCS#8) or private-JWK key file that only its owner can read."""
    try:
        data = read_private(path, max_bytes=MAX_KEY_FILE_BYTES)
    except PrivateFileError as exc:
        raise _key_file_error(exc) from exc
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileError("key-too-large", path, f"larger than {MAX_KEY_FILE_BYTES} bytes; not a key file")
    try:
        return load_private_key(data)
    except KeyFormatError as exc:
        raise KeyFileError(exc.reason, path, f"not a usable Ed25519 private key ({exc.detail})") from exc


def load_public_key_file(path: Path) -> PublicKey:
    """A public Ed25519 key from a file: SPKI PEM, a public JWK, or a private key file (PKCS#8 PEM
    or private JWK, owner-only as ``load_key_file`` wants it) whose public half is taken, so the
    file an agent signs with can be pinned as it is. KeyFileError names the path and the reason."""
    data = read_public_file(path).strip()
    try:
        if data.startswith(b"{"):
            jwk = loads_strict(data)
            if isinstance(jwk, dict) and PRIVATE_JWK_MEMBERS.intersection(jwk):
                return load_key_file(path).public
            return public_key_from_jwk(jwk)
        if b"PRIVATE KEY-----" in data:
            return load_key_file(path).public
        return PublicKey.from_pem(data)
    except KeyFormatError as exc:
        raise KeyFileError(exc.reason, path, f"not a usable Ed25519 public key ({exc.detail})") from None
    except ValueError as exc:
        raise KeyFileError("malformed-jwk", path, f"not valid JSON: {exc}") from None


def read_public_file(path: Path, *, max_bytes: int = MAX_KEY_FILE_BYTES, what: str = "key file") -> bytes:
    """The bytes of a public key file or JWK Set (``what``, for messages): a regular file of at most
    ``max_bytes``.

    Opened without blocking (a FIFO answers at once) and checked on the opened file (fstat), so the
    file checked is the file read; at most ``max_bytes`` + 1 bytes are ever read (``/dev/zero``).
    KeyFileError names the path and the reason (``key-unreadable``, ``key-too-large``).
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise KeyFileError("key-unreadable", path, f"cannot read {what}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise KeyFileError("key-unreadable", path, f"not a regular file; a {what} is read from one")
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise KeyFileError("key-unreadable", path, f"cannot read {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise KeyFileError("key-too-large", path, f"larger than {max_bytes} bytes; not a {what}")
    return data


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
