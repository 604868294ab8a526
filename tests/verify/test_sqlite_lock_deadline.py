"""The SQLite store's operations each have one timeout from when they are asked: while another
process holds the write lock, N queued operations all fail after about one timeout (the store's
"database is locked", the gateway's 503), not one after another at N timeouts; then it recovers."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from signing_proxy.core.gateway_ingest import QuotaCounter
from signing_proxy.verify import counters
from signing_proxy.verify.counters import SqliteCounterStore
from tests.harness import WAIT_S

NOW = 1_800_000_000.0
TIMEOUT_MS = 300
QUEUED = 8


async def test_queued_operations_share_one_timeout_while_the_file_is_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(counters, "SQLITE_BUSY_TIMEOUT_MS", TIMEOUT_MS)
    path = tmp_path / "counters.sqlite3"
    store = SqliteCounterStore(path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        assert await store.first_seen("before", 60, NOW)  # the file and its tables exist
        other.execute("BEGIN IMMEDIATE")  # another worker (or a backup) holds the write lock
        try:
            started = time.monotonic()

            async def one(i: int) -> BaseException | None:
                try:
                    if i % 2:
                        await store.first_seen(f"sig-{i}", 60, NOW)
                    else:
                        await store.take_all((QuotaCounter(f"chain-{i}", 5, 60),), NOW)
                except sqlite3.OperationalError as exc:
                    return exc
                return None

            results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(QUEUED))), WAIT_S)
            elapsed = time.monotonic() - started
        finally:
            other.execute("ROLLBACK")
        assert all(isinstance(r, sqlite3.OperationalError) for r in results), results
        assert all("locked" in str(r) for r in results)
        # one timeout for all of them (the old store: QUEUED timeouts, 2.4 s), with room for a slow machine
        assert elapsed < 2.5 * TIMEOUT_MS / 1000, f"{QUEUED} queued operations took {elapsed:.2f} s"
        assert await asyncio.wait_for(store.first_seen("after", 60, NOW), WAIT_S)  # the lock gone: served
    finally:
        other.close()
        await store.close()
