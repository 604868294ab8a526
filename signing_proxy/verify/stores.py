"""Which counter store a ``gateway.store`` setting names."""

from __future__ import annotations

from pathlib import Path

from .counters import SQLITE_FILE, CounterStore, SqliteCounterStore

__all__ = ["open_counter_store"]


def open_counter_store(spec: str, data_dir: Path) -> CounterStore:
    """``sqlite`` (a file in ``data_dir``), ``sqlite:///PATH``, or ``redis://`` / ``rediss://`` /
    ``unix://`` URLs (the Redis store)."""
    if spec == "sqlite":
        return SqliteCounterStore(data_dir / SQLITE_FILE)
    if spec.startswith("sqlite:///"):
        return SqliteCounterStore(Path(spec[len("sqlite://") :]))
    if spec.startswith(("redis://", "rediss://", "unix://")):
        from .redis_counters import RedisCounterStore  # noqa: PLC0415 (redis loads only when configured)

        return RedisCounterStore.from_url(spec)
    raise ValueError(f"{spec!r}: a counter store is 'sqlite', sqlite:///PATH or a redis:// URL")
