"""The SQLite store's prune of expired rows: found by an index on ``expires_at`` (no whole-table
scan under the write lock), also in a file an earlier version wrote, and a bounded batch at a time
that deletes only expired rows."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.core.gateway_ingest import QuotaCounter
from signing_proxy.verify import counters
from signing_proxy.verify.counters import SqliteCounterStore

NOW = 1_800_000_000.0
# the tables as the first versions created them: no stranger column, no index but the keys'
OLD_SCHEMA = (
    "CREATE TABLE counters (key TEXT PRIMARY KEY, count INTEGER NOT NULL, expires_at REAL)",
    "CREATE TABLE seen (key TEXT PRIMARY KEY, expires_at REAL NOT NULL)",
)


def traced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement the store's connection runs, its parameters bound (on the store's thread)."""
    statements: list[str] = []
    connect: Callable[..., sqlite3.Connection] = sqlite3.connect

    def tracing(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        db = connect(*args, **kwargs)
        db.set_trace_callback(statements.append)
        return db

    monkeypatch.setattr(sqlite3, "connect", tracing)  # the store's module calls sqlite3.connect
    return statements


def rows(path: Path, table: str) -> list[tuple[str, float | None]]:
    with sqlite3.connect(path) as db:
        return sorted(db.execute(f"SELECT key, expires_at FROM {table}").fetchall())


@pytest.mark.parametrize("existing", [False, True], ids=["new-file", "earlier-version-file"])
async def test_the_prune_finds_expired_rows_by_an_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existing: bool
) -> None:
    path = tmp_path / "counters.sqlite3"
    if existing:
        with sqlite3.connect(path) as db:
            for statement in OLD_SCHEMA:
                db.execute(statement)
    monkeypatch.setattr(counters, "PRUNE_EVERY", 4)
    statements = traced(monkeypatch)
    store = SqliteCounterStore(path)
    try:
        for i in range(4):  # the fourth write prunes
            await store.first_seen(f"sig-{i}", 60, NOW)
    finally:
        await store.close()
    prunes = [s for s in statements if s.lstrip().upper().startswith("DELETE")]
    assert {"counters", "seen"} <= {s.split()[2] for s in prunes}  # both tables pruned
    with sqlite3.connect(path) as db:
        for statement in prunes:
            plan = " / ".join(row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {statement}"))
            table = statement.split()[2]
            assert f"SCAN {table}" not in plan, f"{statement}: {plan}"
            assert "INDEX" in plan, f"{statement}: {plan}"


async def test_a_prune_deletes_only_expired_rows_a_batch_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "counters.sqlite3"
    monkeypatch.setattr(counters, "PRUNE_EVERY", 1_000_000)  # none while the rows are written
    store = SqliteCounterStore(path)
    try:
        for i in range(10):  # expire at NOW + 10
            await store.first_seen(f"old-{i}", 10, NOW)
            await store.take_all((QuotaCounter(f"old-{i}", 5, 10),), NOW)
        for i in range(3):  # expire at NOW + 1000, or never (a lifetime quota)
            await store.first_seen(f"live-{i}", 1000, NOW)
            await store.take_all((QuotaCounter(f"live-{i}", 5, 1000),), NOW)
            await store.take_all((QuotaCounter(f"forever-{i}", 5, None),), NOW)
        monkeypatch.setattr(counters, "PRUNE_EVERY", 1)  # every write prunes from now on
        monkeypatch.setattr(counters, "PRUNE_BATCH", 4, raising=False)  # (the old store had none)
        later = NOW + 100
        remaining = []
        for i in range(3):
            await store.first_seen(f"new-{i}", 1000, later)  # one write, one batch per table
            remaining.append(
                (
                    sum(k.startswith("old-") for k, _ in rows(path, "seen")),
                    sum(k.startswith("old-") for k, _ in rows(path, "counters")),
                )
            )
        assert remaining == [(6, 6), (2, 2), (0, 0)]  # 4 expired rows of each table per prune
        assert [k for k, _ in rows(path, "seen")] == [f"live-{i}" for i in range(3)] + [
            f"new-{i}" for i in range(3)
        ]
        assert [k for k, _ in rows(path, "counters")] == [f"forever-{i}" for i in range(3)] + [
            f"live-{i}" for i in range(3)
        ]
    finally:
        await store.close()
