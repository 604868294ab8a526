"""RFC 3339 values are read only within what ``format_rfc3339`` writes back (0001-01-01T00:00:00Z to
9999-12-31T23:59:59Z): ``9999-12-31T23:59:60Z`` (a leap second, counted as the next second) or an
offset past either end was read, then refused when shown (``keys list`` died with a traceback)."""

from __future__ import annotations

import pytest

from signing_proxy.core.errors import KeyFormatError
from signing_proxy.core.rfc3339 import format_rfc3339, parse_rfc3339

FIRST, LAST = -62_135_596_800, 253_402_300_799


def test_the_ends_are_read_and_written_back() -> None:
    assert parse_rfc3339("0001-01-01T00:00:00Z") == FIRST
    assert parse_rfc3339("9999-12-31T23:59:59Z") == LAST
    assert parse_rfc3339("9999-12-31T23:59:59.5Z") == LAST  # floored
    assert format_rfc3339(FIRST) == "0001-01-01T00:00:00Z"
    assert format_rfc3339(LAST) == "9999-12-31T23:59:59Z"
    assert parse_rfc3339("2016-12-31T23:59:60Z") == parse_rfc3339("2017-01-01T00:00:00Z")  # a leap second


@pytest.mark.parametrize(
    ("value", "round_up"),
    [
        ("9999-12-31T23:59:60Z", False),
        ("9999-12-31T23:59:59-00:01", False),
        ("9999-12-31T23:59:59-23:59", False),
        ("0001-01-01T00:00:00+00:01", False),
        ("9999-12-31T23:59:59.5Z", True),
    ],
)
def test_a_moment_that_cannot_be_written_back_is_refused(value: str, round_up: bool) -> None:
    with pytest.raises(KeyFormatError) as caught:
        parse_rfc3339(value, round_up=round_up)
    assert caught.value.reason == "malformed-timestamp"
    assert "is outside 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z" in caught.value.detail
    assert parse_rfc3339(value, round_up=round_up, bounded=False) not in range(FIRST, LAST + 1)
