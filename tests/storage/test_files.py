"""Owner-only files: atomic writes with exact modes, private reads refused with a reason, flock locks;
and the key file's words for each refusal."""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from signing_proxy.core.jwk import SigningKey
from signing_proxy.errors import KeyFileError
from signing_proxy.storage.files import (
    PrivateFileError,
    check_private_dir,
    file_lock,
    make_private_dir,
    read_private,
    write_atomic,
    write_new,
)
from signing_proxy.storage.keyfile import load_key_file, write_private_file


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """A umask that would widen nothing and narrow nothing: modes must come from the code alone."""
    before = os.umask(0)
    try:
        yield
    finally:
        os.umask(before)


@pytest.mark.usefixtures("loose_umask")
def test_write_atomic_sets_the_mode_and_replaces_the_file(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    write_atomic(target, b"one")
    assert (target.read_bytes(), mode(target)) == (b"one", 0o600)
    inode = target.stat().st_ino
    write_atomic(target, b"two", 0o644)
    assert (target.read_bytes(), mode(target)) == (b"two", 0o644)
    assert target.stat().st_ino != inode  # a new file renamed over the old one
    assert [p.name for p in tmp_path.iterdir()] == ["secret"]


def test_a_failed_rename_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "secret"
    target.write_bytes(b"old")

    def fail(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space"):
        write_atomic(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["secret"]


@pytest.mark.parametrize("name", ["/", ".", "", "{tmp}/gone/..", "{tmp}/here/..", "{tmp}/here"])
def test_write_atomic_refuses_a_path_that_names_a_directory(tmp_path: Path, name: str) -> None:
    """``/`` and ``.`` raised "ValueError: ... has an empty name" (a traceback for ``keys generate``)."""
    (tmp_path / "here").mkdir()
    with pytest.raises(IsADirectoryError, match="names a directory, not a file"):
        write_atomic(Path(name.format(tmp=tmp_path)), b"secret")
    assert [p.name for p in tmp_path.iterdir()] == ["here"]
    assert list((tmp_path / "here").iterdir()) == []


@pytest.mark.usefixtures("loose_umask")
def test_make_private_dir_creates_0700_once(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "b"
    assert make_private_dir(folder)
    assert mode(folder) == 0o700
    assert not make_private_dir(folder)
    check_private_dir(folder)


def test_write_new_refuses_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "key.pem"
    write_new(path, b"x")
    assert mode(path) == 0o600
    with pytest.raises(FileExistsError):
        write_new(path, b"y")


def test_read_private_reads_an_owner_only_file_up_to_a_bound(tmp_path: Path) -> None:
    path = tmp_path / "f"
    write_atomic(path, b"0123456789")
    assert read_private(path) == b"0123456789"
    assert read_private(path, max_bytes=4) == b"01234"  # one more than allowed: the caller can tell


@pytest.mark.parametrize("bits", [0o040, 0o004, 0o020, 0o002])
def test_read_private_refuses_what_group_or_others_can_access(tmp_path: Path, bits: int) -> None:
    path = tmp_path / "f"
    write_atomic(path, b"x")
    path.chmod(0o600 | bits)
    with pytest.raises(PrivateFileError) as err:
        read_private(path)
    assert (err.value.reason, err.value.mode, err.value.path) == ("too-open", 0o600 | bits, path)


def test_read_private_refuses_missing_folders_and_fifos_without_blocking(tmp_path: Path) -> None:
    with pytest.raises(PrivateFileError) as err:
        read_private(tmp_path / "missing")
    assert err.value.reason == "missing"
    folder = tmp_path / "folder"
    folder.mkdir(mode=0o700)
    with pytest.raises(PrivateFileError) as err:
        read_private(folder)
    assert err.value.reason == "wrong-kind"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(PrivateFileError) as err:
        read_private(fifo)  # no writer: a blocking open would hang here
    assert err.value.reason == "wrong-kind"


def test_check_private_dir_refuses_open_folders_and_files(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    with pytest.raises(PrivateFileError) as err:
        check_private_dir(folder)
    assert (err.value.reason, err.value.mode) == ("too-open", 0o755)
    file = tmp_path / "file"
    file.write_bytes(b"")
    with pytest.raises(PrivateFileError) as err:
        check_private_dir(file)
    assert err.value.reason == "wrong-kind"


def test_an_exclusive_lock_excludes_others_until_released(tmp_path: Path) -> None:
    lock = tmp_path / ".lock"
    with pytest.raises(FileNotFoundError), file_lock(lock, shared=True):  # never creates the file
        pass
    with file_lock(lock):
        assert mode(lock) == 0o600
        fd = os.open(lock, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    with file_lock(lock, shared=True):
        fd = os.open(lock, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # readers share
        finally:
            os.close(fd)


# --- the key file's words ------------------------------------------------------------------------


def test_key_file_refusals_name_the_reason_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "agent.pem"
    with pytest.raises(KeyFileError) as err:
        load_key_file(path)
    assert (err.value.reason, err.value.detail) == ("key-missing", "key file does not exist")
    key = SigningKey.generate()
    write_private_file(path, key.to_pem())
    assert mode(path.parent) == 0o700
    assert load_key_file(path).thumbprint == key.thumbprint
    with pytest.raises(FileExistsError, match="refusing to overwrite a key"):
        write_private_file(path, key.to_pem())
    path.chmod(0o644)
    with pytest.raises(KeyFileError) as err:
        load_key_file(path)
    assert err.value.reason == "key-permissions"
    assert err.value.detail == (
        f"key file mode is 0644; it must be readable by its owner only (run: chmod 600 {path})"
    )
    with pytest.raises(KeyFileError) as err:
        load_key_file(tmp_path)
    assert (err.value.reason, err.value.detail) == ("key-unreadable", "key path is not a regular file")
