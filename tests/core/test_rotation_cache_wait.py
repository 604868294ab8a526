"""The default activation waits for the longest-held cached copy of the directory: the configured
max-age, or longer while a copy the listener served (with a higher max-age) may be cached until
``cached_until``; never past the window of the key signing now. ``now`` injected."""

from __future__ import annotations

import pytest

from signing_proxy.core.rotation import ROTATION_MARGIN_S, KeyRecord, activation_delay, cache_wait

T = 1_800_000_000
OLD = KeyRecord("old", T, T + 100_000, created_at=T)


def test_a_later_served_copy_lengthens_the_wait() -> None:
    assert cache_wait(600, T + 100, T + 100 + 21_600) == 21_600
    assert activation_delay([OLD], T + 100, 600, cached_until=T + 100 + 21_600) == 21_600 + ROTATION_MARGIN_S


def test_an_earlier_served_copy_changes_nothing() -> None:
    assert cache_wait(600, T + 100, T + 100 + 60) == 600
    assert cache_wait(600, T + 100, None) == 600
    assert activation_delay([OLD], T + 100, 600, cached_until=T + 50) == 600 + ROTATION_MARGIN_S


def test_the_boundary_second_and_a_fraction() -> None:
    assert cache_wait(600, T + 100, T + 700) == 600  # exactly the max-age: no longer
    assert cache_wait(600, T + 100, T + 701) == 601
    assert cache_wait(600, T + 99.5, T + 701) == 601  # counted from the next whole second


def test_the_wait_never_outlasts_the_signing_key() -> None:
    assert activation_delay([OLD], T + 100, 600, cached_until=T + 200_000) == OLD.not_after - (T + 100)


def test_no_key_signing_now_waits_for_nothing() -> None:
    assert activation_delay([], T, 600, cached_until=T + 21_600) == 0


def test_a_negative_max_age_is_refused() -> None:
    with pytest.raises(ValueError, match="max-age"):
        cache_wait(-1, T, None)
