"""A reload that finds the store locked by another process (a ``keys`` command stopped with Ctrl-Z, a
key-sync copying) gives up within ``RELOAD_LOCK_WAIT_S`` and tries again at the next check; a forced
re-read (SIGHUP) that met the lock is done at the next check.

The fault: the reload's thread waited in ``flock`` for as long as the other process held the lock;
``asyncio.run`` waits for that thread at exit, so SIGTERM did not stop the proxy.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from signing_proxy.storage.files import file_lock
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider
from tests.harness import WAIT_S

T = 1_800_000_000  # 2027-01-15T08:00:00Z


@contextlib.contextmanager
def held(lock: Path) -> Iterator[None]:
    """The store's lock, taken exclusively on a descriptor of its own (as another process would)."""
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def reload_on_a_thread(provider: StoreKeyProvider, *, force: bool) -> list[bool]:
    """``provider.reload`` on a thread, waited for at most ``WAIT_S``: its result, or nothing."""
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(provider.reload(force=force)), daemon=True)
    thread.start()
    thread.join(WAIT_S)
    return result


def test_a_reload_gives_up_on_a_held_lock_and_a_forced_one_is_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = KeyStore(tmp_path / "data")
    store.create(T, lifetime_s=100_000)
    provider = StoreKeyProvider(store)
    with caplog.at_level(logging.INFO, logger="signing_proxy.keys"):
        with held(store.path / ".lock"):
            assert reload_on_a_thread(provider, force=True) == [False]  # SIGHUP: it returned
            assert reload_on_a_thread(provider, force=False) == [False]  # the next check: still locked
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1  # once while it stays locked
        assert "locked by another process" in warnings[0]
        assert str(store.path) in warnings[0]
        assert not [r for r in caplog.records if "reloaded key store" in r.getMessage()]
        assert provider.reload() is True  # unforced, index unchanged: the SIGHUP's re-read happens now
    assert [r for r in caplog.records if "reloaded key store" in r.getMessage()]


def test_a_bounded_lock_wait_gives_up_with_blocking_io_error(tmp_path: Path) -> None:
    lock = tmp_path / ".lock"
    lock.touch(mode=0o600)
    with held(lock), pytest.raises(BlockingIOError), file_lock(lock, shared=True, wait_s=0.05):
        pytest.fail("the lock is held elsewhere")
    with file_lock(lock, shared=True, wait_s=0.05):  # free again: taken at once
        pass
