"""``served.json``: what the publication listener served, as ``keys rotate`` reads it. What it says
(``latest(now)``) never goes down, across renewals and restarts with a lower max-age; it is bounded,
owner-only, and a malformed one is refused naming its path. Times injected, no clock read."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from signing_proxy.errors import StorageError
from signing_proxy.storage.files import make_private_dir
from signing_proxy.storage.served import (
    MAX_SERVED_LISTENERS,
    SERVED_NAME,
    SERVED_RENEW_S,
    SERVED_WRITE_INTERVAL_S,
    ServedRecord,
    read_served,
    renew_served,
)

T = 1_800_000_000
HIGH, LOW = 21_600, 600


def latest_at(record: ServedRecord, now: float) -> int:
    found = record.latest(now)
    assert found is not None
    return found[0]


def test_a_running_listener_counts_its_copies_up_to_now_plus_its_max_age() -> None:
    record = ServedRecord().renewed("a", HIGH, T)
    assert record.latest(T) == (T + HIGH, HIGH)
    assert record.latest(T + 30) == (T + 30 + HIGH, HIGH)  # still renewing: still serving
    # it stopped renewing: its copies were served until its promise at the latest
    assert record.latest(T + 10 * SERVED_RENEW_S) == (T + SERVED_RENEW_S + HIGH, HIGH)


def test_nothing_goes_down_across_a_restart_with_a_lower_max_age() -> None:
    record = ServedRecord().renewed("first", HIGH, T)
    record = record.renewed("first", HIGH, T + SERVED_WRITE_INTERVAL_S)  # renewed once, then stopped
    promised = T + SERVED_WRITE_INTERVAL_S + SERVED_RENEW_S
    seen = latest_at(record, T + 90)
    for now in range(T + 90, T + 90 + 3 * SERVED_RENEW_S + HIGH, 30):  # the second one, renewing
        record = record.renewed("second", LOW, now)
        latest = latest_at(record, now)
        assert latest >= seen, now
        assert latest >= T + SERVED_WRITE_INTERVAL_S + HIGH  # the first one's copies
        seen = latest
    assert [e.id for e in record.listeners] == ["second"]  # the first one, lapsed, is folded in
    assert (record.cached_until_s, record.cached_max_age_s) == (promised + HIGH, HIGH)


def test_a_renewal_never_shortens_its_own_promise() -> None:
    record = ServedRecord().renewed("a", HIGH, T + 100)
    again = record.renewed("a", HIGH, T)  # a clock stepped back
    assert again.listeners[0].until == T + 100 + SERVED_RENEW_S


def test_the_record_is_bounded_folding_the_earliest_promises_in_whole() -> None:
    record = ServedRecord()
    for i in range(MAX_SERVED_LISTENERS + 5):
        record = record.renewed(f"l{i}", LOW + i, T + i)
    assert len(record.listeners) == MAX_SERVED_LISTENERS
    assert record.listeners[-1].id == f"l{MAX_SERVED_LISTENERS + 4}"
    folded = [T + i + SERVED_RENEW_S + LOW + i for i in range(5)]
    assert record.cached_until_s == max(folded)


def test_the_file_is_written_owner_only_and_read_back(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    make_private_dir(folder)
    assert read_served(folder) is None
    assert renew_served(folder, "a", HIGH, T) is None
    path = folder / SERVED_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    record = read_served(folder)
    assert record == ServedRecord().renewed("a", HIGH, T)
    renew_served(folder, "b", LOW, T + 10)
    assert {e.id for e in read_served(folder).listeners} == {"a", "b"}  # type: ignore[union-attr]


def test_a_writer_cut_short_leaves_no_temporary_behind(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    make_private_dir(folder)
    left = folder / f".{SERVED_NAME}.0123456789abcdef.tmp"
    left.write_bytes(b"half")
    other = folder / ".keys.json.0123456789abcdef.tmp"  # the key store's: not ours to delete
    other.write_bytes(b"half")
    renew_served(folder, "a", HIGH, T)
    assert not left.exists()
    assert other.exists()


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[]",
        b'{"format":"signing-proxy-served/2","cached_until":null,"cached_max_age_s":null,"listeners":[]}',
        b'{"format":"signing-proxy-served/1","cached_until":null,"cached_max_age_s":null}',
        b'{"format":"signing-proxy-served/1","cached_until":"2027-01-01T00:00:00Z","cached_max_age_s":null,'
        b'"listeners":[]}',
        b'{"format":"signing-proxy-served/1","cached_until":null,"cached_max_age_s":null,"listeners":'
        b'[{"id":"a","max_age_s":999999,"until":"2027-01-01T00:00:00Z"}]}',
        b'{"format":"signing-proxy-served/1","cached_until":null,"cached_max_age_s":null,"listeners":'
        b'[{"id":"a/..","max_age_s":60,"until":"2027-01-01T00:00:00Z"}]}',
        b'{"format":"signing-proxy-served/1","cached_until":null,"cached_max_age_s":null,"listeners":'
        b'[{"id":"a","max_age_s":true,"until":"2027-01-01T00:00:00Z"}]}',
        b'{"format":"signing-proxy-served/1","cached_until":null,"cached_max_age_s":null,"listeners":'
        b'[{"id":"a","max_age_s":60,"until":"tomorrow"}]}',
        b" " * (20 * 1024),
    ],
    ids=[
        "not-json",
        "not-object",
        "format",
        "member-missing",
        "half-null",
        "max-age-range",
        "id",
        "bool",
        "time",
        "too-large",
    ],
)
def test_a_malformed_record_is_refused_naming_its_path(tmp_path: Path, content: bytes) -> None:
    folder = tmp_path / "store"
    make_private_dir(folder)
    path = folder / SERVED_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(content)
    with pytest.raises(StorageError) as caught:
        read_served(folder)
    assert caught.value.reason == "served-unusable"
    assert str(path) in str(caught.value)
    # the listener replaces it, saying what it ignored
    ignored = renew_served(folder, "a", HIGH, T)
    assert ignored is not None
    assert str(path) in str(ignored)
    assert read_served(folder) == ServedRecord().renewed("a", HIGH, T)


def test_a_record_open_to_others_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    make_private_dir(folder)
    renew_served(folder, "a", HIGH, T)
    (folder / SERVED_NAME).chmod(0o644)
    with pytest.raises(StorageError, match="mode is 0644"):
        read_served(folder)


def test_the_rendered_record_is_plain_json(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    make_private_dir(folder)
    renew_served(folder, "a", HIGH, T)
    doc = json.loads((folder / SERVED_NAME).read_text())
    assert doc == {
        "format": "signing-proxy-served/1",
        "cached_until": None,
        "cached_max_age_s": None,
        "listeners": [{"id": "a", "max_age_s": HIGH, "until": "2027-01-15T08:02:00Z"}],
    }
