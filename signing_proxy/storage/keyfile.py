"""Private key files on disk: owner-only, refused loudly when they are not.

A key that others can read is a key that others may have: the proxy refuses to start with a key
file that is group- or world-readable, rather than signing with it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..core.errors import KeyFormatError
from ..core.jwk import SigningKey, load_private_key
from ..errors import KeyFileError

__all__ = ["KeyFileError", "load_key_file", "write_private_file"]


def write_private_file(path: Path, data: bytes, *, overwrite: bool = False) -> None:
    """Write ``data`` readable by the owner only (0600), atomically; never widen an existing file."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; refusing to overwrite a key")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_key_file(path: Path) -> SigningKey:
    """Load a PEM (PKCS#8) or private-JWK key file that only its owner can read."""
    try:
        st = path.stat()
    except FileNotFoundError as exc:
        raise KeyFileError("key-missing", path, "key file does not exist") from exc
    except OSError as exc:
        raise KeyFileError("key-unreadable", path, f"cannot stat key file: {exc.strerror}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError("key-unreadable", path, "key path is not a regular file")
    if st.st_mode & 0o077:
        raise KeyFileError(
            "key-permissions",
            path,
            f"key file mode is {stat.S_IMODE(st.st_mode):04o}; it must be readable by its owner only "
            f"(run: chmod 600 {path})",
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise KeyFileError("key-unreadable", path, f"cannot read key file: {exc.strerror}") from exc
    try:
        return load_private_key(data)
    except KeyFormatError as exc:
        raise KeyFileError(exc.reason, path, f"not a usable Ed25519 private key ({exc.detail})") from exc
