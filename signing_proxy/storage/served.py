"""What the publication listener has served: until when a copy of an agent's directory may be cached.

``keys rotate`` makes a new key sign only once no cached copy of the directory lacks it. The copies
that count are the ones the listener served, with the max-age it was started with (``publish`` is
restart-only: an edit and a SIGHUP do not change what it serves), not the max-age of the ``--config``
the command reads; and a copy fetched before a restart with a lower max-age is still held for the old
one. So the listener keeps a record in the store folder of each agent it publishes, ``served.json``
(owner-only, written atomically under its own lock), and ``keys rotate`` waits for it.

The record holds one entry per listener that renews it (its max-age, and ``until``: the moment by
which it renews again, ``SERVED_RENEW_S`` ahead), and ``cached_until``: how long the copies of the
listeners that stopped renewing may be cached (``until`` + their max-age, folded in once ``until``
has passed). What it says, ``latest(now)``, never goes down: a renewal only moves moments later, and
a restart with a lower max-age adds an entry beside the old one, folded in whole once it lapses.
"""

from __future__ import annotations

import json
import math
from collections.abc import Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ..config import DIRECTORY_MAX_AGE_RANGE_S
from ..core.errors import KeyFormatError
from ..core.json_bounds import loads_strict
from ..core.keys import format_rfc3339, parse_rfc3339
from ..errors import StorageError
from .files import PrivateFileError, file_lock, read_private, sweep, temporary_target, write_atomic

__all__ = [
    "SERVED_FORMAT",
    "SERVED_NAME",
    "SERVED_RENEW_S",
    "SERVED_WRITE_INTERVAL_S",
    "ServedListener",
    "ServedRecord",
    "read_served",
    "renew_served",
]

SERVED_NAME: Final = "served.json"
SERVED_FORMAT: Final = "signing-proxy-served/1"
SERVED_LOCK_NAME: Final = ".served.lock"  # read-merge-write of replicas sharing one store: one at a time
SERVED_WRITE_INTERVAL_S: Final = 60  # our choice: how often a running listener renews its entry
# our choice: an entry promises to be renewed within this (one late or failed write to spare); copies a
# listener served are counted as served up to the rotation, or up to this promise once it has passed
SERVED_RENEW_S: Final = 2 * SERVED_WRITE_INTERVAL_S
SERVED_LOCK_WAIT_S: Final = 1.0  # our choice: a write waits this long for another writer's lock
MAX_SERVED_BYTES: Final = 16 * 1024  # our choice: the record's size bound (MAX_SERVED_LISTENERS fit)
MAX_SERVED_LISTENERS: Final = 32  # our choice: entries kept; more are folded into cached_until
_MAX_LISTENER_ID_CHARS: Final = 64
_MEMBERS: Final = frozenset({"format", "cached_until", "cached_max_age_s", "listeners"})


@dataclass(frozen=True)
class ServedListener:
    """A listener serving the directory with ``max_age_s``, which renews its entry before ``until``."""

    id: str
    max_age_s: int
    until: int

    def cached_until(self, now: float) -> int:
        """The copies it served up to ``now`` (or up to ``until``, if it stopped renewing) expire by then."""
        return min(math.ceil(now), self.until) + self.max_age_s


@dataclass(frozen=True)
class ServedRecord:
    """``served.json``: the listeners renewing it, and how long the copies of those gone may be cached."""

    cached_until_s: int | None = None  # the copies of listeners no longer listed
    cached_max_age_s: int | None = None  # the max-age those copies were served with
    listeners: tuple[ServedListener, ...] = ()

    def latest(self, now: float) -> tuple[int, int] | None:
        """``(until when, with which max-age)`` of the copy served so far that may be cached longest."""
        found = [(entry.cached_until(now), entry.max_age_s) for entry in self.listeners]
        if self.cached_until_s is not None and self.cached_max_age_s is not None:
            found.append((self.cached_until_s, self.cached_max_age_s))
        return max(found, default=None)

    def renewed(self, listener_id: str, max_age_s: int, now: float) -> ServedRecord:
        """This record with ``listener_id`` serving ``max_age_s`` from ``now`` on; entries whose
        ``until`` has passed are folded into ``cached_until``. Nothing it promised moves earlier."""
        start = math.ceil(now)
        until = start + SERVED_RENEW_S
        kept: list[ServedListener] = []
        gone: list[ServedListener] = []
        for entry in self.listeners:
            if entry.id == listener_id and entry.max_age_s == max_age_s:
                until = max(until, entry.until)  # its own promise, made again: never earlier
            elif entry.until <= start or entry.id == listener_id:
                gone.append(entry)  # stopped renewing: its copies are cached until + max-age at most
            else:
                kept.append(entry)
        kept.sort(key=lambda e: (e.until, e.id))
        while len(kept) >= MAX_SERVED_LISTENERS:  # bounded: the earliest promise is folded in whole
            gone.append(kept.pop(0))
        folded = [(e.until + e.max_age_s, e.max_age_s) for e in gone]
        if self.cached_until_s is not None and self.cached_max_age_s is not None:
            folded.append((self.cached_until_s, self.cached_max_age_s))
        latest = max(folded, default=None)
        kept.append(ServedListener(listener_id, max_age_s, until))
        listeners = tuple(sorted(kept, key=lambda e: (e.until, e.id)))
        if latest is None:
            return ServedRecord(None, None, listeners)
        return ServedRecord(latest[0], latest[1], listeners)


def read_served(folder: Path) -> ServedRecord | None:
    """The record in the store folder ``folder``; None when there is none. A record that cannot be
    used (unreadable, open to others, malformed) raises ``StorageError`` (``served-unusable``)."""
    path = folder / SERVED_NAME
    try:
        data = read_private(path, max_bytes=MAX_SERVED_BYTES)
    except PrivateFileError as exc:
        if exc.reason == "missing":
            return None
        raise StorageError("served-unusable", path, exc.detail) from None
    if len(data) > MAX_SERVED_BYTES:
        raise StorageError("served-unusable", path, f"larger than {MAX_SERVED_BYTES} bytes")
    try:
        return _parse(data)
    except (ValueError, KeyFormatError) as exc:
        detail = exc.detail if isinstance(exc, KeyFormatError) else str(exc)
        raise StorageError("served-unusable", path, f"malformed: {detail}") from None


def renew_served(folder: Path, listener_id: str, max_age_s: int, now: float) -> StorageError | None:
    """Renew ``listener_id``'s entry in ``folder``'s record (under its lock, atomically, 0600).

    Returns the refusal of a previous record that could not be used (it is replaced: nothing in it
    can be read), else None. OSError (the folder is not writable, the lock stays taken) reaches the
    caller, which keeps serving."""
    with file_lock(folder / SERVED_LOCK_NAME, wait_s=SERVED_LOCK_WAIT_S):
        _sweep(folder)
        problem: StorageError | None = None
        try:
            record = read_served(folder) or ServedRecord()
        except StorageError as exc:
            problem, record = exc, ServedRecord()
        write_atomic(folder / SERVED_NAME, _render(record.renewed(listener_id, max_age_s, now)))
        return problem


def _sweep(folder: Path) -> None:
    """Delete the temporaries of ``served.json`` a writer cut short left (under the lock: none is live)."""
    sweep(folder, lambda name: temporary_target(name) == SERVED_NAME)


def _render(record: ServedRecord) -> bytes:
    cached = record.cached_until_s
    doc: dict[str, Any] = {
        "format": SERVED_FORMAT,
        "cached_until": None if cached is None else format_rfc3339(cached),
        "cached_max_age_s": record.cached_max_age_s,
        "listeners": [
            {"id": e.id, "max_age_s": e.max_age_s, "until": format_rfc3339(e.until)} for e in record.listeners
        ],
    }
    return (json.dumps(doc, indent=2) + "\n").encode("ascii")


def _parse(data: bytes) -> ServedRecord:
    doc = _object(loads_strict(data, max_depth=4), _MEMBERS)
    if doc["format"] != SERVED_FORMAT:
        raise ValueError(f"format is not {SERVED_FORMAT!r}")
    cached, cached_age = doc["cached_until"], doc["cached_max_age_s"]
    if (cached is None) != (cached_age is None):
        raise ValueError("cached_until and cached_max_age_s are both set or both null")
    listeners = doc["listeners"]
    if not isinstance(listeners, list) or len(listeners) > MAX_SERVED_LISTENERS:
        raise ValueError(f"listeners must be a list of at most {MAX_SERVED_LISTENERS}")
    entries = []
    for i, raw in enumerate(listeners):
        entry = _object(raw, {"id", "max_age_s", "until"}, f"listeners[{i}]")
        ident = entry["id"]
        if not isinstance(ident, str) or not 0 < len(ident) <= _MAX_LISTENER_ID_CHARS or not ident.isalnum():
            raise ValueError(f"listeners[{i}].id must be 1-{_MAX_LISTENER_ID_CHARS} letters or digits")
        age = _max_age(entry["max_age_s"], f"listeners[{i}].max_age_s")
        entries.append(ServedListener(ident, age, parse_rfc3339(entry["until"])))
    if cached is None:
        return ServedRecord(None, None, tuple(entries))
    return ServedRecord(parse_rfc3339(cached), _max_age(cached_age, "cached_max_age_s"), tuple(entries))


def _object(value: object, members: Set[str], where: str = "the record") -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) != members:
        raise ValueError(f"{where} must be an object of exactly {', '.join(sorted(members))}")
    return value


def _max_age(value: object, where: str) -> int:
    high = DIRECTORY_MAX_AGE_RANGE_S[1]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise ValueError(f"{where} must be a whole number of seconds from 0 to {high}")
    return value
