"""Owner-only files, in one place: atomic writes, private reads with the permission check, and flock locks.

A secret that others can read is a secret that others may have: private files are 0600 in 0700
folders, written to a temporary file, fsynced and renamed over the target (a reader sees the old
file or the new one, never half of one), and refused on reading when group or others can access
them. ``PrivateFileError`` says why a file or folder cannot be used; each caller (key file, key
store, CA) turns it into its own error with its own reason and words.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

if sys.platform != "win32":
    import fcntl

from ..errors import StorageError

__all__ = [
    "GROUP_OTHER_BITS",
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "PUBLIC_FILE_MODE",
    "PrivateFileError",
    "check_private_dir",
    "file_lock",
    "make_private_dir",
    "read_private",
    "temporary_target",
    "write_all",
    "write_atomic",
    "write_new",
]

PRIVATE_FILE_MODE: Final = 0o600
PRIVATE_DIR_MODE: Final = 0o700
PUBLIC_FILE_MODE: Final = 0o644  # certificates and CA bundles: public by design
GROUP_OTHER_BITS: Final = 0o077

_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
# A FIFO or device at a key path must be refused, not block the open: O_NONBLOCK (no effect on files).
_O_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)
# ``write_atomic``'s temporary for ``<name>``: ``.<name>.<16 hex>.tmp`` (what a crash may leave behind)
_TEMPORARY_RE: Final = re.compile(r"\.(?P<target>.+)\.[0-9a-f]{16}\.tmp")
_LOCK_RETRY_S: Final = 0.01  # our choice: how often a bounded wait tries a busy lock again


class PrivateFileError(StorageError):
    """A private file or folder that cannot be used. ``reason``: ``missing``, ``denied`` (open refused
    by the OS), ``unreadable`` (``operation`` says ``stat`` or ``read``; ``os_error`` is the cause),
    ``wrong-kind`` (not a regular file / not a directory) or ``too-open`` (``mode`` has group/other bits).
    """

    def __init__(
        self,
        reason: str,
        path: Path,
        detail: str,
        *,
        mode: int = 0,
        operation: str = "",
        os_error: OSError | None = None,
    ) -> None:
        super().__init__(reason, path, detail)
        self.mode = mode
        self.operation = operation
        self.os_error = os_error


def read_private(path: Path, *, max_bytes: int | None = None) -> bytes:
    """The bytes of a regular file that only its owner can access (at most ``max_bytes`` + 1 of them,
    so a caller can tell an oversized file); raises ``PrivateFileError``. Checks the opened file
    (fstat), so the file checked is the file read."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC | _O_NONBLOCK)
    except FileNotFoundError:
        raise PrivateFileError("missing", path, "does not exist") from None
    except PermissionError as exc:
        raise PrivateFileError("denied", path, exc.strerror or "permission denied", os_error=exc) from None
    except OSError as exc:
        raise PrivateFileError(
            "unreadable", path, exc.strerror or str(exc), operation="stat", os_error=exc
        ) from None
    try:
        st = os.fstat(fd)
        _check_owner_only(path, st, directory=False)
        try:
            with os.fdopen(os.dup(fd), "rb") as fh:
                return fh.read() if max_bytes is None else fh.read(max_bytes + 1)
        except OSError as exc:
            raise PrivateFileError(
                "unreadable", path, exc.strerror or str(exc), operation="read", os_error=exc
            ) from None
    finally:
        os.close(fd)


def check_private_dir(path: Path) -> None:
    """Refuse (``PrivateFileError``) a folder that is missing, not a folder, or open to group/others."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise PrivateFileError("missing", path, "does not exist") from None
    except OSError as exc:
        raise PrivateFileError(
            "unreadable", path, exc.strerror or str(exc), operation="stat", os_error=exc
        ) from None
    _check_owner_only(path, st, directory=True)


def _check_owner_only(path: Path, st: os.stat_result, *, directory: bool) -> None:
    kind_ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    if not kind_ok:
        what = "a directory" if directory else "a regular file"
        raise PrivateFileError("wrong-kind", path, f"is not {what}")
    if st.st_mode & GROUP_OTHER_BITS:
        mode = stat.S_IMODE(st.st_mode)
        raise PrivateFileError("too-open", path, f"mode is {mode:04o}", mode=mode)


def make_private_dir(path: Path) -> bool:
    """Create ``path`` when it does not exist (missing parents with the default mode), the folder itself
    0700 whatever the umask; True when it was created. An existing folder is left as it is."""
    if path.is_dir():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, PRIVATE_DIR_MODE)
    except FileExistsError:
        return False  # another process made it a moment ago
    os.chmod(path, PRIVATE_DIR_MODE)  # the umask must not change what we asked for
    return True


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_atomic(path: Path, data: bytes, mode: int = PRIVATE_FILE_MODE) -> None:
    """Write ``data`` to a fresh ``mode`` file next to ``path``, fsync it, then rename it over ``path``.

    A ``path`` that names a directory (``.``, ``/``, ``..``, an existing folder) raises
    IsADirectoryError before anything is written."""
    if path.name in ("", "..") or path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "names a directory, not a file", str(path))
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")  # temporary_target's pattern
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask must not loosen or tighten what we asked for
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename durable; best effort
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def temporary_target(name: str) -> str | None:
    """The file name a ``write_atomic`` temporary named ``name`` was to replace; None when ``name`` is
    not one (a crash between its creation and its rename leaves it behind: its owner sweeps it)."""
    match = _TEMPORARY_RE.fullmatch(name)
    return None if match is None else match["target"]


def sweep(folder: Path, doomed: Callable[[str], bool]) -> list[str]:
    """Delete the regular files directly in ``folder`` whose name ``doomed`` says (a symbolic link is
    left alone, as is what cannot be listed or deleted); the names deleted. For an owner's leftovers
    (``temporary_target``), under the lock its writers take, so that none is live."""
    try:
        with os.scandir(folder) as found:
            names = [f.name for f in found if f.is_file(follow_symlinks=False) and doomed(f.name)]
    except OSError:
        return []
    deleted = []
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(folder / name)
            deleted.append(name)
    return deleted


def write_new(path: str | Path, data: bytes, mode: int = PRIVATE_FILE_MODE) -> None:
    """Create ``path`` (which must not exist) with ``mode`` and write ``data`` to it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, mode)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


@contextlib.contextmanager
def file_lock(path: Path, *, shared: bool = False, wait_s: float | None = None) -> Iterator[None]:
    """An advisory ``flock`` on ``path`` for the block: exclusive (the file is created 0600 when
    missing) or ``shared`` (the file must exist: a missing one raises FileNotFoundError). OSError
    from opening reaches the caller; the lock is released when the block ends. No-op on Windows.

    ``wait_s``: give up after that long (BlockingIOError) instead of waiting for as long as another
    process holds the lock: a thread blocked in ``flock`` cannot be interrupted, and an interpreter
    that is exiting waits for it."""
    if sys.platform == "win32":
        yield
        return
    if shared:
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
    else:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        operation = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        if wait_s is None:
            fcntl.flock(fd, operation)
        else:
            _flock_within(fd, operation, wait_s)
        yield
    finally:
        os.close(fd)  # releases the lock


def _flock_within(fd: int, operation: int, wait_s: float) -> None:
    """``flock`` without blocking, tried again until ``wait_s`` has passed (flock has no timeout)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            time.sleep(min(_LOCK_RETRY_S, left))
