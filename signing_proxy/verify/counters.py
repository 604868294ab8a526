"""The gateway's shared state: access counters per delegation chain and signatures already seen.

A ``CounterStore`` does two atomic things. ``take_all`` counts one access against several limits
at once (a chain's capped links), each within a window that opens at its first access and closes
``window_s`` later (the spec's ``quota_period``; a lifetime quota passes the grant's remaining
life): when every counter is below its limit all are incremented and the access admitted; when one
is at its limit none is counted, and the answer says when that one's window ends. ``take`` is the
one-counter case.
``first_seen`` records a key for ``ttl_s`` and says whether it was new (replay protection).

Strangers' rows are bounded. Any https issuer may sign chains with caps (``gateway.trusted_issuers_only``
is false by default), and each new capped chain is a counter row kept for its window (a
``quota_period`` of up to 10,000 years, a grant's life until an ``exp`` as late as the year 9999). So
``take_all`` is told ``max_stranger_rows`` when the chain's authority issuer is not in
``gateway.trusted_issuers``: the rows it creates are marked a stranger's, and a take that would
create one while the live stranger rows would then number more than ``max_stranger_rows`` counts
nothing and raises ``StrangerRowsFull`` (the gateway answers 503 ``quota-store-full``). Rows that
exist keep counting (never reset, never refused for the bound), a trusted issuer's chain is never
refused for it, and an expired row leaves the bound. The check is inside the same atomic step as
the count, so concurrent workers or replicas cannot overshoot it.

Strangers' replay rows are bounded the same way. With replay protection every accepted signature is
a row kept for its validity (up to ``verify.max_validity_s``), and anyone with a self-published key
directory can sign fresh ones at full rate. So ``first_seen`` is told ``max_stranger_rows`` for a
request no trusted issuer vouches for: a new key that arrives while the live strangers' replay rows
number ``max_stranger_rows`` is not recorded and raises ``ReplayRowsFull`` (503
``replay-store-full``). A signature seen before is answered as seen (a replay) whatever the bound;
trusted requests are never refused for it; an expired row leaves the bound.

Two stores: ``SqliteCounterStore`` (the embedded default, a file in the data directory; every
operation is one ``BEGIN IMMEDIATE`` transaction, so ``--workers`` processes sharing the file
never lose or double a count) and ``verify.redis_counters.RedisCounterStore`` for several gateway
replicas (one Lua script per ``take`` and per ``first_seen``). ``now`` is given by the
caller (wall-clock seconds): every process on the machine agrees on it.

``ping`` is the cheap probe behind the gateway's ``counter_store`` readiness check: a ``SELECT 1``
for SQLite, the epoch sentinel's ``GET`` for Redis.
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from ..core.errors import Error
from ..core.gateway_ingest import QuotaCounter

__all__ = [
    "QUOTA_STORE_FULL",
    "REPLAY_STORE_FULL",
    "SQLITE_FILE",
    "CounterStore",
    "ReplayRowsFull",
    "SqliteCounterStore",
    "StrangerRowsFull",
    "Taken",
]

SQLITE_FILE = "gateway-counters.sqlite3"  # in data_dir
SQLITE_BUSY_TIMEOUT_MS = 5000  # our choice: an operation waits this long for another's transaction
PRUNE_EVERY = 256  # our choice: expired rows are deleted once per this many writes
# our choice: at most this many expired rows of each table per prune (16 per write, more than a
# write creates: a chain's capped links, at most MAX_CHAIN_LINKS), so a prune's transaction is short
PRUNE_BATCH = 4096
QUOTA_STORE_FULL = "quota-store-full"
REPLAY_STORE_FULL = "replay-store-full"


class StrangerRowsFull(Error):
    """The take would create a counter row of an untrusted issuer's chain while the live rows of
    such chains are at ``max_stranger_rows``: nothing was counted (refused, fail closed)."""

    def __init__(self, limit: int) -> None:
        super().__init__(QUOTA_STORE_FULL, f"{limit} counters of untrusted issuers' chains are live")


class ReplayRowsFull(Error):
    """``first_seen`` would record a new signature of a request no trusted issuer vouches for while
    such requests' live replay rows are at ``max_stranger_rows``: nothing was recorded (refused)."""

    def __init__(self, limit: int) -> None:
        super().__init__(REPLAY_STORE_FULL, f"{limit} replay rows of untrusted requests are live")


@dataclass(frozen=True, slots=True)
class Taken:
    """The verdict of one ``take``: admitted or not, the count after it, when the window ends."""

    allowed: bool
    count: int
    reset_at: float | None  # unix seconds; None: the counter never resets


class CounterStore(Protocol):
    async def take_all(
        self, counters: Sequence[QuotaCounter], now: float, max_stranger_rows: int | None = None
    ) -> tuple[int, Taken]:
        """Count one access on every counter if each is below its limit, else on none (atomic).

        Returns the index of the counter that decided, with its figures: the first one at its
        limit when refused, else the one with the fewest accesses left. ``max_stranger_rows``
        (None: the chain's issuer is trusted) marks the rows this take creates as a stranger's and
        raises ``StrangerRowsFull``, counting nothing, when creating them would leave more live
        stranger rows than that."""
        ...

    async def first_seen(
        self, key: str, ttl_s: float, now: float, max_stranger_rows: int | None = None
    ) -> bool:
        """Record ``key`` for ``ttl_s``; True if it was not recorded already (atomic).

        ``max_stranger_rows`` (None: a trusted issuer vouches for the request) marks the row as a
        stranger's and raises ``ReplayRowsFull``, recording nothing, when a new row would leave more
        live stranger rows than that. A key recorded already answers False, bound or not."""
        ...

    async def ping(self) -> None:
        """Reach the store once; raise when it cannot count (the caller bounds the wait)."""
        ...

    async def close(self) -> None: ...


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS counters (key TEXT PRIMARY KEY, count INTEGER NOT NULL, expires_at REAL, "
    "stranger INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS seen (key TEXT PRIMARY KEY, expires_at REAL NOT NULL, "
    "stranger INTEGER NOT NULL DEFAULT 0)",
)
# The prune finds expired rows by these (added to files an earlier version wrote, on open): without
# them each prune scanned both tables whole under the write lock, a stall linear in the live rows.
_EXPIRY_SCHEMA = (
    "CREATE INDEX IF NOT EXISTS counters_expiry ON counters (expires_at)",
    "CREATE INDEX IF NOT EXISTS seen_expiry ON seen (expires_at)",
)
_PRUNE = (
    "DELETE FROM counters WHERE rowid IN "
    "(SELECT rowid FROM counters WHERE expires_at <= ? ORDER BY expires_at LIMIT ?)",
    "DELETE FROM seen WHERE rowid IN "
    "(SELECT rowid FROM seen WHERE expires_at <= ? ORDER BY expires_at LIMIT ?)",
)
# Strangers' rows (stranger = 1): their number is kept in ``tally`` by triggers, whatever statement
# inserts, updates or deletes them (a count, the prune, another worker), so the bound is read in O(1);
# the partial index finds the expired ones without a scan.
_STRANGER_SCHEMA = (
    "CREATE INDEX IF NOT EXISTS counters_stranger_expiry ON counters (expires_at) WHERE stranger = 1",
    "CREATE TABLE IF NOT EXISTS tally (name TEXT PRIMARY KEY, n INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO tally (name, n) SELECT 'stranger_rows', COUNT(*) FROM counters WHERE stranger = 1",
    "CREATE TRIGGER IF NOT EXISTS stranger_row_in AFTER INSERT ON counters WHEN NEW.stranger = 1 "
    "BEGIN UPDATE tally SET n = n + 1 WHERE name = 'stranger_rows'; END",
    "CREATE TRIGGER IF NOT EXISTS stranger_row_out AFTER DELETE ON counters WHEN OLD.stranger = 1 "
    "BEGIN UPDATE tally SET n = n - 1 WHERE name = 'stranger_rows'; END",
    "CREATE TRIGGER IF NOT EXISTS stranger_row_flag AFTER UPDATE OF stranger ON counters "
    "WHEN NEW.stranger <> OLD.stranger "
    "BEGIN UPDATE tally SET n = n + NEW.stranger - OLD.stranger WHERE name = 'stranger_rows'; END",
)
_TALLY = "SELECT n FROM tally WHERE name = 'stranger_rows'"
# Strangers' replay rows (seen.stranger = 1), tallied the same way under their own name.
_SEEN_STRANGER_SCHEMA = (
    "CREATE INDEX IF NOT EXISTS seen_stranger_expiry ON seen (expires_at) WHERE stranger = 1",
    "INSERT OR IGNORE INTO tally (name, n) SELECT 'stranger_seen', COUNT(*) FROM seen WHERE stranger = 1",
    "CREATE TRIGGER IF NOT EXISTS stranger_seen_in AFTER INSERT ON seen WHEN NEW.stranger = 1 "
    "BEGIN UPDATE tally SET n = n + 1 WHERE name = 'stranger_seen'; END",
    "CREATE TRIGGER IF NOT EXISTS stranger_seen_out AFTER DELETE ON seen WHEN OLD.stranger = 1 "
    "BEGIN UPDATE tally SET n = n - 1 WHERE name = 'stranger_seen'; END",
    "CREATE TRIGGER IF NOT EXISTS stranger_seen_flag AFTER UPDATE OF stranger ON seen "
    "WHEN NEW.stranger <> OLD.stranger "
    "BEGIN UPDATE tally SET n = n + NEW.stranger - OLD.stranger WHERE name = 'stranger_seen'; END",
)
_SEEN_TALLY = "SELECT n FROM tally WHERE name = 'stranger_seen'"


def _create_schema(db: sqlite3.Connection) -> None:
    """The tables, in one transaction: workers starting together on a file written by an earlier
    version (no ``stranger`` columns: its rows are all counted as trusted) add the columns once."""
    db.execute("BEGIN IMMEDIATE")
    try:
        for statement in _SCHEMA:
            db.execute(statement)
        columns = {row[1] for row in db.execute("PRAGMA table_info(counters)")}
        if "stranger" not in columns:
            db.execute("ALTER TABLE counters ADD COLUMN stranger INTEGER NOT NULL DEFAULT 0")
        if "stranger" not in {row[1] for row in db.execute("PRAGMA table_info(seen)")}:
            db.execute("ALTER TABLE seen ADD COLUMN stranger INTEGER NOT NULL DEFAULT 0")
        for statement in (*_STRANGER_SCHEMA, *_SEEN_STRANGER_SCHEMA, *_EXPIRY_SCHEMA):
            db.execute(statement)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


WAL_SWITCH_TRIES = 100  # our choice: 100 x 20 ms; the switch ignores busy_timeout while a peer holds the file


def _set_wal(db: sqlite3.Connection) -> None:
    """``PRAGMA journal_mode=WAL``, retried: on a new file, workers (or gateways) starting together
    race to switch it, and the loser is told "database is locked" at once (the busy timeout does
    not apply to the switch). Runs on the store's own thread, never on the event loop."""
    for attempt in range(WAL_SWITCH_TRIES):
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == WAL_SWITCH_TRIES - 1:
                raise
            time.sleep(0.02)


_T = TypeVar("_T")


class SqliteCounterStore:
    """Counters in one SQLite file, safe across processes; blocking calls run on one thread of our own.

    Each operation has ``timeout_s`` from when it is asked, its wait in the thread's queue included:
    while another process holds the write lock, queued operations would otherwise each wait the
    whole busy timeout in turn (the Nth answered after N timeouts). One whose time ran out in the
    queue is refused as SQLite refuses a wait that runs out ("database is locked"), and the rest is
    the busy timeout of the one that runs."""

    def __init__(self, path: Path, timeout_s: float | None = None) -> None:
        self.path = path
        self.timeout_s = SQLITE_BUSY_TIMEOUT_MS / 1000 if timeout_s is None else timeout_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="counters")
        self._db: sqlite3.Connection | None = None
        self._writes = 0
        self._busy_ms = math.ceil(self.timeout_s * 1000)  # the running operation's (store's thread)

    async def _run(self, job: Callable[..., _T], *args: object) -> _T:
        """``job(*args)`` on the store's thread, by a deadline counted from now."""
        deadline = time.monotonic() + self.timeout_s
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._by, deadline, job, *args)

    def _by(self, deadline: float, job: Callable[..., _T], *args: object) -> _T:
        left = deadline - time.monotonic()
        if left <= 0:
            raise sqlite3.OperationalError("database is locked (the wait ran out in the store's queue)")
        busy_ms = max(1, math.ceil(left * 1000))
        if self._db is not None and busy_ms != self._busy_ms:
            self._db.execute(f"PRAGMA busy_timeout = {busy_ms}")
        self._busy_ms = busy_ms
        return job(*args)

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(  # timeout: SQLite's busy timeout, what is left of the operation's
                self.path, timeout=self._busy_ms / 1000, isolation_level=None
            )
            _set_wal(db)  # readers never block the writer
            # no fsync per count: a crash of the process loses nothing, a power cut the last moments
            db.execute("PRAGMA synchronous=NORMAL")
            _create_schema(db)
            self._db = db
        return self._db

    async def take_all(
        self, counters: Sequence[QuotaCounter], now: float, max_stranger_rows: int | None = None
    ) -> tuple[int, Taken]:
        return await self._run(self._take_all, tuple(counters), now, max_stranger_rows)

    async def first_seen(
        self, key: str, ttl_s: float, now: float, max_stranger_rows: int | None = None
    ) -> bool:
        return await self._run(self._first_seen, key, ttl_s, now, max_stranger_rows)

    async def ping(self) -> None:
        """A trivial query on the store's thread: raises when the file cannot be opened or read."""
        await self._run(self._ping)

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close)
        self._executor.shutdown(wait=True)

    # --- on the store's thread ---
    def _take_all(
        self, counters: tuple[QuotaCounter, ...], now: float, max_stranger_rows: int | None
    ) -> tuple[int, Taken]:
        db = self._connect()
        db.execute("BEGIN IMMEDIATE")  # the write lock first: no other process reads a stale count
        try:
            current = []
            created = False
            for index, (key, limit, window_s) in enumerate(counters):
                row = db.execute(
                    "SELECT count, expires_at, stranger FROM counters WHERE key = ?", (key,)
                ).fetchone()
                if row is None or (row[1] is not None and row[1] <= now):
                    # a row this take creates: a stranger's when its chain's issuer is not trusted
                    created = True
                    count, expires_at = 0, (now + window_s if window_s is not None else None)
                    stranger = int(max_stranger_rows is not None)
                else:
                    count, expires_at, stranger = int(row[0]), row[1], int(row[2])
                if count >= limit:
                    db.execute("COMMIT")
                    return index, Taken(False, count, expires_at)
                current.append((key, count + 1, expires_at, stranger))
            bound = max_stranger_rows if created else None  # None: this take adds no stranger row
            live = 0
            if bound is not None:  # expired strangers' rows leave the bound (the index finds only those)
                db.execute("DELETE FROM counters WHERE stranger = 1 AND expires_at <= ?", (now,))
                live = int(db.execute(_TALLY).fetchone()[0])
            db.executemany(
                "INSERT INTO counters (key, count, expires_at, stranger) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET count = excluded.count, expires_at = excluded.expires_at, "
                "stranger = excluded.stranger",
                current,
            )
            if bound is not None:
                after = int(db.execute(_TALLY).fetchone()[0])
                if after > live and after > bound:  # this take adds a stranger row past the bound:
                    raise StrangerRowsFull(bound)  # rolled back (the purge too), nothing counted
            self._maybe_prune(db, now)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        index = min(range(len(counters)), key=lambda i: counters[i].limit - current[i][1])
        return index, Taken(True, current[index][1], current[index][2])

    def _first_seen(self, key: str, ttl_s: float, now: float, max_stranger_rows: int | None) -> bool:
        db = self._connect()
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT expires_at FROM seen WHERE key = ?", (key,)).fetchone()
            fresh = row is None or row[0] <= now
            bound = max_stranger_rows if fresh else None  # a key seen before is no new row
            full = bound is not None and self._seen_full(db, now, bound)  # the purged stay purged
            if fresh and not full:
                db.execute(
                    "INSERT INTO seen (key, expires_at, stranger) VALUES (?, ?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET expires_at = excluded.expires_at, "
                    "stranger = excluded.stranger",
                    (key, now + ttl_s, int(max_stranger_rows is not None)),
                )
                self._maybe_prune(db, now)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        if bound is not None and full:  # nothing recorded
            raise ReplayRowsFull(bound)
        return fresh

    @staticmethod
    def _seen_full(db: sqlite3.Connection, now: float, bound: int) -> bool:
        """Whether strangers' live replay rows are at ``bound``: at it, a batch of expired ones leaves
        first (never more than ``PRUNE_BATCH`` under the write lock; the next call takes the next)."""
        if int(db.execute(_SEEN_TALLY).fetchone()[0]) < bound:
            return False
        db.execute(
            "DELETE FROM seen WHERE rowid IN "
            "(SELECT rowid FROM seen WHERE stranger = 1 AND expires_at <= ? LIMIT ?)",
            (now, PRUNE_BATCH),
        )
        return int(db.execute(_SEEN_TALLY).fetchone()[0]) >= bound

    def _maybe_prune(self, db: sqlite3.Connection, now: float) -> None:
        self._writes += 1
        if self._writes % PRUNE_EVERY == 0:  # a batch of each table (a NULL expiry never matches)
            for statement in _PRUNE:
                db.execute(statement, (now, PRUNE_BATCH))

    def _ping(self) -> None:
        self._connect().execute("SELECT 1").fetchone()

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
